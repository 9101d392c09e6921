// Alternating PowerSGD on the device (device_schedule.h, runAlternateOnDevice; docs/design.md,
// "Alternating factors" and "Host and device schedules"): the twin of the host's
// runAlternateOnHost (plugin/engine/host_alternate.cc), one factor allreduce per call, chunked
// and pipelined as PowerSGD's: the step's kernels on the buffer's compute stream, each chunk's
// allreduce on the communication stream as soon as the chunk is computed, the decompression of
// a chunk as soon as its factor is back.
#include "cuda_backend/device_schedule.h"

namespace lowrank::cuda {

using namespace schedule;

Err runAlternateOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                         lowrankRedOp_t op, const float* freshQ, bool qStep, cudaStream_t s) {
  const lowrankCudaPlan_t& pl = b.plan;
  const auto dtype = lowrankDataType_t(pl.dtype);
  const int N = dc.nranks;
  // This step's payload: the payload itself (P step) or the wire (Q step), each laid out as
  // lowrankPayload [exact part | factor | non-finite count | op].
  const lowrankPayloadLayout_t at = lowrankPayload(pl.exactElems, qStep ? pl.qElems : pl.pElems);
  float* pay = qStep ? b.wire : b.payload;
  float* p = b.payload + pl.exactElems;  // P: this step's (P step), the kept one (Q step)
  float* qw = b.wire + pl.exactElems;    // the Q step's Qt by column blocks
  float* checks = pay + at.flag;         // the non-finite count, then the op code
  const float opCode = lowrankPayloadOpCode(op);
  const float expectedOp = opCode * float(N);
  // 16-bit factors: each step rounds its own factor to the wire before taking the residual (the
  // allreduce then carries those values exactly), as the host's alternateStepP / Q.
  const auto wire = lowrankDataType_t(pl.factorDtype);

  // The kept factor, the same on every comm rank, orthonormalized (the fresh Q already is). A Q
  // step orthonormalizes each tensor's P before the first Q chunk that reads it (below).
  if (!qStep) LR_TRY(prepareQ(b, dc, freshQ, s));
  LR_CUDA(cudaMemsetAsync(checks, 0, sizeof(float), s));
  LR_CUDA(setFloat(checks + 1, opCode, s));

  // The exact part travels first, under the step's pass, in a call of its own (as PowerSGD's on
  // the device).
  if (pl.exactElems) {
    LR_CUDA(packExact(b.exact, send, dtype, pay, checks, s));
    LR_CUDA(cudaEventRecord(b.done, s));  // reused as "exact part packed"
    LR_TRY(reduceOn(dc, pay, pl.exactElems, b.done, b.exactReduced));
  }

  // The one pass over M, chunk by chunk, each chunk reduced as soon as it is computed; the last
  // carries the two checks (a P chunk's count holds them already: engine/plan.h).
  cudaEvent_t last = nullptr;
  if (!qStep) {
    for (PChunkState& ch : b.pChunks) {
      LR_CUDA(alternateStepP(ch.blocks, send, dtype, b.e, b.qt, p, checks, s, wire));
      LR_CUDA(cudaEventRecord(ch.computed, s));
      LR_TRY(reduceOn(dc, b.payload + ch.offset, ch.count, ch.computed, ch.reduced,
                      pFactors(b, ch)));
    }
    last = b.pChunks.back().reduced;
  } else {
    for (size_t c = 0; c < b.qChunks.size(); ++c) {
      QChunkState& ch = b.qChunks[c];
      if (ch.ortho) LR_CUDA(orthonormalize(ch.ortho, p, pl.orthoEpsilon, s));
      LR_CUDA(alternateStepQ(ch.blocks, send, dtype, b.e, p, qw, checks, s, wire));
      LR_CUDA(cudaEventRecord(ch.computed, s));
      const size_t withChecks = c + 1 == b.qChunks.size() ? 2 : 0;
      LR_TRY(reduceOn(dc, qw + ch.offset, ch.count + withChecks, ch.computed, ch.reduced,
                      factorsOf(b, 0, ch.count, ch.offset)));
    }
    last = b.qChunks.back().reduced;
  }

  // The checks are in once the last chunk is reduced: copy them for the engine's counters.
  LR_TRY(queueChecks(b, checks, expectedOp, last, s));

  if (pl.exactElems) {
    LR_CUDA(cudaStreamWaitEvent(s, b.exactReduced, 0));
    LR_CUDA(unpackExact(b.exact, pay, op == lowrankAvg ? 1.f / float(N) : 1.f, recv, dtype, s));
  }

  // The decompression chunk by chunk, out = s P Q^T from the reduced factor (divided by N: kept)
  // and the kept one; no residual (taken before the allreduce) unless the checks reject the call
  // (then E = 0 and out NaN). The kernels read the checks, which come with the last chunk, so
  // every chunk's decompression follows the whole allreduce, as on the host (the wait on each
  // chunk's own event is then already met: it keeps each launch's inputs explicit).
  const float outScale = op == lowrankSum ? float(N) : 1.f;
  if (!qStep) {
    for (size_t c = 0; c < b.pChunks.size(); ++c) {
      PChunkState& ch = b.pChunks[c];
      LR_CUDA(cudaStreamWaitEvent(s, ch.reduced, 0));
      const size_t factor = ch.count - (c + 1 == b.pChunks.size() ? 2 : 0);
      LR_CUDA(scale(b.payload + ch.offset, factor, 1.f / float(N), s));
      LR_CUDA(decompressAlternate(ch.blocks, b.e, p, b.qt, outScale, recv, dtype, checks,
                                  expectedOp, s));
    }
    // A rejected P step must not leave its reduced P as the next Q step's factor.
    for (QChunkState& ch : b.qChunks)
      if (ch.ortho) LR_CUDA(unitFactorIfRejected(ch.ortho, p, checks, expectedOp, s));
  } else {
    for (QChunkState& ch : b.qChunks) {
      LR_CUDA(cudaStreamWaitEvent(s, ch.reduced, 0));
      LR_CUDA(scale(qw + ch.offset, ch.count, 1.f / float(N), s));
      LR_CUDA(decompressAlternate(ch.blocks, b.e, p, qw, outScale, recv, dtype, checks,
                                  expectedOp, s));
    }
    // Qbar into the whole-tensor Qt, the next P step's Q, unless the checks reject the call.
    LR_CUDA(scatterQ(b.scatter, qw, b.qt, checks, expectedOp, s));
  }
  LR_CUDA(cudaEventRecord(b.done, s));
  return Err::Ok();
}

}  // namespace lowrank::cuda
