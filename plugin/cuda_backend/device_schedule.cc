#include "cuda_backend/device_schedule.h"

#include <algorithm>
#include <cstring>

#include "cuda_backend/device_wait.h"

namespace lowrank::cuda {
namespace schedule {

namespace {
Err reduceFloats(const DeviceComm& dc, float* x, size_t count) {
  if (!count) return Err::Ok();
  LR_TRY(ncclIssue(dc, "ncclAllReduce of PowerSGD factors", [&] {
    return dc.api->allReduce(x, x, count, lowrankFloat32, lowrankSum, dc.comm, dc.stream);
  }));
  dc.countSent(count, sizeof(float));
  return Err::Ok();
}
}  // namespace

Err reduceOn(const DeviceComm& dc, float* x, size_t count, cudaEvent_t ready, cudaEvent_t reduced,
             const Factors& f) {
  LR_CUDA(cudaStreamWaitEvent(dc.stream, ready, 0));
  const bool half = f.dtype != lowrankFloat32 && f.hi > f.lo;
  if (!half) {
    LR_TRY(reduceFloats(dc, x, count));
  } else {
    // [0, lo) float32 (none in the schedules: the exact part has its call), [lo, hi) 16-bit,
    // [hi, count) float32 (the checks of the last chunk), one NCCL call each, in that order.
    const size_t n = f.hi - f.lo;
    LR_TRY(reduceFloats(dc, x, f.lo));
    LR_CUDA(toWire(x + f.lo, n, f.scratch, f.dtype, dc.stream));
    LR_TRY(ncclIssue(dc, "ncclAllReduce of PowerSGD factors (16-bit)", [&] {
      return dc.api->allReduce(f.scratch, f.scratch, n, f.dtype, lowrankSum, dc.comm, dc.stream);
    }));
    dc.countSent(n, sizeof(uint16_t));
    LR_CUDA(fromWire(f.scratch, n, x + f.lo, f.dtype, dc.stream));
    LR_TRY(reduceFloats(dc, x + f.hi, count - f.hi));
  }
  LR_CUDA(cudaEventRecord(reduced, dc.stream));
  return Err::Ok();
}

Factors factorsOf(const DeviceBuffer& b, size_t lo, size_t hi, size_t factorBase) {
  Factors f;
  if (b.plan.factorDtype == lowrankFloat32 || !b.wire16 || hi <= lo) return f;
  f.dtype = lowrankDataType_t(b.plan.factorDtype);
  f.lo = lo;
  f.hi = hi;
  f.scratch = b.wire16 + factorBase;
  return f;
}

// A fresh draw is liblowrank's (the same numbers as the host engine, orthonormalized on the
// host); it is staged in a pinned block of the communicator's pool, then copied; the block goes
// back to the pool, reusable once the copy has run.
Err prepareQ(DeviceBuffer& b, const DeviceComm& dc, const float* freshQ, cudaStream_t s) {
  const lowrankCudaPlan_t& pl = b.plan;
  if (!freshQ) {
    LR_CUDA(orthonormalize(b.orthoQ, b.qt, pl.orthoEpsilon, s));
    return Err::Ok();
  }
  const size_t bytes = pl.qElems * sizeof(float);
  void* staged = nullptr;
  LR_TRY(dc.pinned.take(bytes, &staged));
  std::memcpy(staged, freshQ, bytes);
  const cudaError_t e = cudaMemcpyAsync(b.qt, staged, bytes, cudaMemcpyHostToDevice, s);
  dc.pinned.give(staged, e == cudaSuccess ? s : nullptr);
  LR_CUDA(e);
  return Err::Ok();
}

Err queueChecks(DeviceBuffer& b, const float* checks, float expectedOp, cudaEvent_t ready,
                cudaStream_t s) {
  const size_t slot = (b.checksFirst + b.checksPending) % DeviceBuffer::kCheckSlots;
  LR_CUDA(cudaStreamWaitEvent(s, ready, 0));
  LR_CUDA(cudaMemcpyAsync(b.hostChecks + 2 * slot, checks, 2 * sizeof(float),
                          cudaMemcpyDeviceToHost, s));
  LR_CUDA(cudaEventRecord(b.checksCopied[slot], s));
  b.expectedOp[slot] = expectedOp;
  ++b.checksPending;
  return Err::Ok();
}

// A P chunk's factors: its floats of the payload's P area [exactElems, flag) (the last chunk also
// carries the two checks, which stay float32).
Factors pFactors(const DeviceBuffer& b, const PChunkState& ch) {
  const lowrankPayloadLayout_t at = lowrankPayload(b.plan.exactElems, b.plan.pElems);
  const size_t from = std::max<size_t>(ch.offset, at.p), to = std::min<size_t>(ch.offset + ch.count, at.flag);
  return to > from ? factorsOf(b, from - ch.offset, to - ch.offset, from - at.p) : Factors{};
}

}  // namespace schedule

using namespace schedule;

Err runCompressedOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                          lowrankRedOp_t op, const float* freshQ, bool qStep, cudaStream_t s) {
  if (b.plan.alternate) return runAlternateOnDevice(b, dc, send, recv, op, freshQ, qStep, s);
  const lowrankCudaPlan_t& pl = b.plan;
  const auto dtype = lowrankDataType_t(pl.dtype);
  const int N = dc.nranks;
  const lowrankPayloadLayout_t at = lowrankPayload(pl.exactElems, pl.pElems);
  float* p = b.payload + at.p;
  float* checks = b.payload + at.flag;  // the non-finite count, then the op code
  const float opCode = lowrankPayloadOpCode(op);

  LR_TRY(prepareQ(b, dc, freshQ, s));
  LR_CUDA(cudaMemsetAsync(checks, 0, sizeof(float), s));
  LR_CUDA(setFloat(b.payload + at.op, opCode, s));

  // The exact part travels first, under pass 1, in a call of its own (docs/design.md, "Host and
  // device schedules").
  if (pl.exactElems) {
    LR_CUDA(packExact(b.exact, send, dtype, b.payload, checks, s));
    LR_CUDA(cudaEventRecord(b.done, s));  // reused as "exact part packed"
    LR_TRY(reduceOn(dc, b.payload, pl.exactElems, b.done, b.exactReduced));
  }

  // Pass 1 by row blocks; each P chunk is reduced as soon as it is computed. The last carries
  // the two checks.
  for (PChunkState& ch : b.pChunks) {
    LR_CUDA(errorFeedbackAndP(ch.blocks, send, dtype, b.e, b.qt, p, checks, s));
    LR_CUDA(cudaEventRecord(ch.computed, s));
    LR_TRY(reduceOn(dc, b.payload + ch.offset, ch.count, ch.computed, ch.reduced,
                    pFactors(b, ch)));
  }

  // Pass 2 by column blocks; a tensor's P is orthonormalized once its last P chunk is reduced.
  for (QChunkState& ch : b.qChunks) {
    if (ch.ortho) {
      LR_CUDA(cudaStreamWaitEvent(s, b.pChunks[ch.waitPChunk].reduced, 0));
      LR_CUDA(orthonormalize(ch.ortho, p, pl.orthoEpsilon, s));
    }
    LR_CUDA(computeQ(ch.blocks, send, dtype, b.e, p, b.wire, s));
    LR_CUDA(cudaEventRecord(ch.computed, s));
    LR_TRY(reduceOn(dc, b.wire + ch.offset, ch.count, ch.computed, ch.reduced,
                    factorsOf(b, 0, ch.count, ch.offset)));
  }

  // The checks are in once the last P chunk is reduced: copy them for the engine's counters,
  // into this call's own slot (the engine has made one free).
  const float expectedOp = opCode * float(N);
  LR_TRY(queueChecks(b, checks, expectedOp, b.pChunks.back().reduced, s));

  if (pl.exactElems) {
    LR_CUDA(cudaStreamWaitEvent(s, b.exactReduced, 0));
    LR_CUDA(unpackExact(b.exact, b.payload, op == lowrankAvg ? 1.f / float(N) : 1.f, recv, dtype,
                        s));
  }

  // Pass 3 chunk by chunk as Q arrives; then Qbar back to the whole-tensor layout (warm start),
  // unless the checks reject the call.
  const float outScale = op == lowrankSum ? float(N) : 1.f;
  for (QChunkState& ch : b.qChunks) {
    LR_CUDA(cudaStreamWaitEvent(s, ch.reduced, 0));
    LR_CUDA(scale(b.wire + ch.offset, ch.count, 1.f / float(N), s));
    LR_CUDA(decompressAndUpdateError(ch.blocks, b.e, p, b.wire, outScale, recv, dtype, checks,
                                     expectedOp, s));
  }
  LR_CUDA(scatterQ(b.scatter, b.wire, b.qt, checks, expectedOp, s));
  LR_CUDA(cudaEventRecord(b.done, s));
  return Err::Ok();
}

}  // namespace lowrank::cuda
