#include "cuda_backend/device_state.h"

#include <algorithm>
#include <mutex>

#include "abi/plugin_log.h"
#include "cuda_backend/device_wait.h"
#include "kernels/cuda/dense_qr.h"

namespace lowrank::cuda {
namespace {

// The supplied allocator's where there is one (a refusal: Err::refused), else stream-ordered on
// `stream` where the device has memory pools, else synchronous. Counted in *bytes.
template <typename T>
Err deviceAlloc(T** p, size_t count, size_t* bytes, cudaStream_t stream, const DeviceAllocator& a) {
  if (count == 0) return Err::Ok();
  const size_t n = count * sizeof(T);
  if (a.alloc) {
    void* got = nullptr;
    if (const lowrankResult_t r = a.alloc(&got, n, a.stream, a.userdata); r != lowrankSuccess || !got) {
      Err e = Err::Fail(lowrankSystemError, "the supplied allocator (lowrankCommSetAllocator) "
                        "could not give %zu bytes (it returned %d)", n, int(r));
      e.refused = true;
      return e;
    }
    *p = static_cast<T*>(got);
  } else if (stream) {
    LR_CUDA(cudaMallocAsync(reinterpret_cast<void**>(p), n, stream));
  } else {
    LR_CUDA(cudaMalloc(reinterpret_cast<void**>(p), n));
  }
  *bytes += n;
  return Err::Ok();
}

// A table's creation: a refusal of the supplied allocator says so.
Err tableMade(cudaError_t e, const TableMemory& mem, const char* what) {
  if (e == cudaSuccess) return Err::Ok();
  if (mem.refused) {
    Err r = Err::Fail(lowrankSystemError, "the supplied allocator (lowrankCommSetAllocator) could "
                      "not give the memory of the %s", what);
    r.refused = true;
    return r;
  }
  return fromCuda(e, what);
}

// Once per process, where a plan has a rank above 32: which orthonormalization serves it.
void reportDenseQr(const lowrankCudaPlan_t& pl) {
  static std::once_flag once;
  if (std::none_of(pl.tensors, pl.tensors + pl.nTensors,
                   [](const lowrankCudaTensor_t& t) { return t.compressed && t.k > 32; }))
    return;
  std::call_once(once, [] {
    const char* why = nullptr;
    if (detail::denseQrApi(&why))
      LR_INFO("CUDA backend: cuSOLVER QR orthonormalizes factors with approximation rank > 32");
    else
      LR_WARN("CUDA backend: %s; factors with approximation rank > 32 are orthonormalized on "
              "one CUDA block each (slower; set LOWRANK_CUSOLVER_LIBRARY)", why);
  });
}

Err event(cudaEvent_t* e) {
  LR_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  return Err::Ok();
}

// A block as the kernels read it: liblowrank resolved it (abi/cuda_backend.h); limit: its tensor's
// overflow bound (read by pass 1 and the alternating steps).
BlockDesc blockDesc(const lowrankCudaBlock_t& b, float limit) {
  BlockDesc d;
  d.offset = b.offset;
  d.valid = b.valid;
  d.ld = b.ld;
  d.rows = uint32_t(b.rows);
  d.cols = uint32_t(b.cols);
  d.k = uint32_t(b.k);
  d.p = b.p;
  d.qt = b.qt;
  d.qld = b.qld;
  d.limit = limit;
  return d;
}

OrthoDesc pOrtho(const lowrankCudaTensor_t& t) {
  return OrthoDesc{t.pOffset, t.rows, uint32_t(t.k), uint64_t(t.k), 1};
}

}  // namespace

bool DeviceBuffer::streamOrdered() const {
  return comm && (comm->asyncAlloc || supplied()) && compute;
}

Err DeviceBuffer::allocate(const lowrankCudaPlan_t& pl, const DeviceComm& dc,
                           const lowrankCudaAllocator_t& a, cudaStream_t callStream) {
  comm = &dc;
  allocator.alloc = a.alloc;
  allocator.free = a.alloc ? a.free : nullptr;
  allocator.userdata = a.userdata;
  allocator.stream = callStream;
  plan = pl;  // the arrays may go after stateCreate
  plan.tensors = nullptr;
  plan.rowBlocks = plan.colBlocks = nullptr;
  plan.pChunks = plan.qChunks = nullptr;
  const uint64_t payloadElems = lowrankPayload(pl.exactElems, pl.pElems).elems;
  Err s = [&]() -> Err {
    // The stream first: the memory and the tables are allocated and uploaded in its order.
    LR_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    // null: synchronously. The supplied allocator's memory is used in its stream's order: the
    // compute stream's, after the planning call's stream (where the allocator gave it).
    cudaStream_t on = dc.asyncAlloc || supplied() ? compute : nullptr;
    if (supplied()) {
      LR_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
      LR_CUDA(cudaEventRecord(forked, callStream));
      LR_CUDA(cudaStreamWaitEvent(compute, forked, 0));
    }
    size_t residual = 0, factors = 0, payloadBytes = 0;
    if (pl.errorFeedback) LR_TRY(deviceAlloc(&e, pl.count, &residual, on, allocator));
    LR_TRY(deviceAlloc(&payload, payloadElems, &payloadBytes, on, allocator));
    LR_TRY(deviceAlloc(&qt, pl.qElems, &factors, on, allocator));
    // Alternating: a Q step's payload [exact part | Qt | checks] (engine/plan.h, qWireElems).
    const uint64_t wireElems =
        pl.alternate ? lowrankPayload(pl.exactElems, pl.qElems).elems : pl.qElems;
    LR_TRY(deviceAlloc(&wire, wireElems, &factors, on, allocator));
    size_t scratch16 = 0;
    if (pl.factorDtype != lowrankFloat32)
      LR_TRY(deviceAlloc(&wire16, std::max<uint64_t>(pl.pElems, pl.qElems), &scratch16, on, allocator));
    bytes = residual + payloadBytes + factors + scratch16;
    memory.residual = residual;
    memory.payload = payloadBytes;
    memory.factors = factors;
    void* checks = nullptr;
    size_t pinnedBytes = 0;
    LR_TRY(dc.pinned.take(kCheckSlots * 2 * sizeof(float), &checks, &pinnedBytes));
    hostChecks = static_cast<float*>(checks);
    memory.pinned = pinnedBytes;
    TableMemory mem;
    mem.allocator = allocator;
    for (cudaEvent_t* ev : {&exactReduced, &done, &forked}) if (!*ev) LR_TRY(event(ev));
    for (cudaEvent_t& ev : checksCopied) LR_TRY(event(&ev));

    std::vector<ExactDesc> exacts;
    std::vector<OrthoDesc> qOrtho;
    for (size_t i = 0; i < pl.nTensors; ++i) {
      const lowrankCudaTensor_t& t = pl.tensors[i];
      if (!t.compressed) exacts.push_back({t.offset, t.numel, t.exactOffset});
      else qOrtho.push_back({t.qOffset, t.cols, uint32_t(t.k), 1, t.cols});
    }
    LR_TRY(tableMade(createExactTable(exacts.data(), exacts.size(), &exact, on, &mem), mem, "exact table"));
    reportDenseQr(pl);
    LR_TRY(tableMade(createOrthoTable(qOrtho.data(), qOrtho.size(), &orthoQ, on, &mem), mem,
                      "orthonormalization table of Q"));

    pChunks.resize(pl.nPChunks);
    for (size_t c = 0; c < pl.nPChunks; ++c) {
      std::vector<BlockDesc> blocks;
      for (size_t b = pl.pChunks[c].first; b < pl.pChunks[c].last; ++b) {
        const lowrankCudaBlock_t& rb = pl.rowBlocks[b];
        blocks.push_back(blockDesc(rb, pl.tensors[rb.tensor].limit));
      }
      LR_TRY(tableMade(createBlockTable(blocks.data(), blocks.size(), &pChunks[c].blocks, on, &mem),
                        mem, "block table of a P chunk"));
      pChunks[c].offset = pl.pChunks[c].offset;
      pChunks[c].count = pl.pChunks[c].count;
      LR_TRY(event(&pChunks[c].computed));
      LR_TRY(event(&pChunks[c].reduced));
    }

    // Q chunks: the blocks, and the tensors whose P is first needed by this chunk.
    std::vector<char> seen(pl.nTensors, 0);
    std::vector<BlockDesc> all;
    std::vector<uint64_t> dstOffset, dstLd;
    qChunks.resize(pl.nQChunks);
    for (size_t c = 0; c < pl.nQChunks; ++c) {
      QChunkState& q = qChunks[c];
      q.offset = pl.qChunks[c].offset;
      q.count = pl.qChunks[c].count;
      std::vector<BlockDesc> blocks;
      std::vector<OrthoDesc> first;
      for (size_t b = pl.qChunks[c].first; b < pl.qChunks[c].last; ++b) {
        const lowrankCudaBlock_t& cb = pl.colBlocks[b];
        const lowrankCudaTensor_t& t = pl.tensors[cb.tensor];
        blocks.push_back(blockDesc(cb, t.limit));  // the alternating Q step counts with it
        all.push_back(blocks.back());
        dstOffset.push_back(t.qOffset + cb.first);
        dstLd.push_back(t.cols);
        if (!seen[cb.tensor]) {
          seen[cb.tensor] = 1;
          first.push_back(pOrtho(t));
          q.waitPChunk = q.waitPChunk == SIZE_MAX ? t.lastPChunk : std::max<size_t>(q.waitPChunk, t.lastPChunk);
        }
      }
      LR_TRY(tableMade(createBlockTable(blocks.data(), blocks.size(), &q.blocks, on, &mem), mem,
                        "block table of a Q chunk"));
      if (!first.empty())
        LR_TRY(tableMade(createOrthoTable(first.data(), first.size(), &q.ortho, on, &mem), mem,
                         "orthonormalization table of P"));
      LR_TRY(event(&q.computed));
      LR_TRY(event(&q.reduced));
    }
    LR_TRY(tableMade(createScatterTable(all.data(), dstOffset.data(), dstLd.data(), all.size(),
                                       &scatter, on, &mem),
                    mem, "scatter table"));
    memory.tables = mem.tables;
    memory.workspace = mem.workspace + scratch16;
    // Without memory pools the tables went up by synchronous copies from pageable memory, on the
    // legacy default stream, which a non-blocking stream is not ordered with, and such a copy may
    // return before its data lands: the compute stream waits for that stream's work so far (no
    // host synchronization). With them, they went up on the compute stream itself.
    if (!on) {
      LR_CUDA(cudaEventRecord(forked, nullptr));
      LR_CUDA(cudaStreamWaitEvent(compute, forked, 0));
    }
    // The factor buffers start at zero, as on the host (padding of P is never written by pass 1).
    LR_CUDA(cudaMemsetAsync(payload, 0, payloadElems * sizeof(float), compute));
    if (e) LR_CUDA(cudaMemsetAsync(e, 0, pl.count * sizeof(float), compute));
    LR_CUDA(cudaEventRecord(done, compute));
    return Err::Ok();
  }();
  if (!s.ok()) release();
  return s;
}

void DeviceBuffer::release() {
  const bool async = streamOrdered();
  if (!async && done && comm && !settleDevice(*comm, done, nullptr)) {
    LR_WARN("CUDA backend: a buffer's last call did not finish (a dead peer, an NCCL failure or an "
            "abort); its %zu bytes of device memory are left allocated", bytes);
    *this = DeviceBuffer();
    return;
  }
  // Stream-ordered: after this buffer's last call and after the communication stream's work so
  // far (a failed call may have left a collective of its factors queued there, unwaited).
  cudaStream_t on = async ? compute : nullptr;
  if (async && comm->stream && forked && cudaEventRecord(forked, comm->stream) == cudaSuccess)
    (void)cudaStreamWaitEvent(compute, forked, 0);
  for (void* p : {static_cast<void*>(e), static_cast<void*>(payload), static_cast<void*>(qt),
                  static_cast<void*>(wire), static_cast<void*>(wire16)}) {
    if (!p) continue;
    if (allocator.free) allocator.free(p, on, allocator.userdata);
    else if (on) cudaFreeAsync(p, on);
    else cudaFree(p);
  }
  if (exact) destroy(exact);  // on the stream each table was made on
  if (orthoQ) destroy(orthoQ);
  if (scatter) destroy(scatter);
  for (PChunkState& c : pChunks) {
    if (c.blocks) destroy(c.blocks);
    for (cudaEvent_t ev : {c.computed, c.reduced}) if (ev) cudaEventDestroy(ev);
  }
  for (QChunkState& c : qChunks) {
    if (c.blocks) destroy(c.blocks);
    if (c.ortho) destroy(c.ortho);
    for (cudaEvent_t ev : {c.computed, c.reduced}) if (ev) cudaEventDestroy(ev);
  }
  if (hostChecks) comm->pinned.give(hostChecks, on);  // reusable once the stream got here
  for (cudaEvent_t ev : {exactReduced, done, forked}) if (ev) cudaEventDestroy(ev);
  if (compute) cudaStreamDestroy(compute);  // returns at once; its queued work still runs
  for (cudaEvent_t ev : checksCopied) if (ev) cudaEventDestroy(ev);
  *this = DeviceBuffer();  // checks still pending are dropped (the engine collects them first)
}

Err DeviceBuffer::collectChecks(size_t wait, uint32_t* rejected, uint32_t* opMismatches) {
  *rejected = 0;
  *opMismatches = 0;
  for (size_t n = 0; checksPending; ++n) {
    const size_t i = checksFirst;
    if (n < wait) LR_TRY(waitDevice(*comm, checksCopied[i], nullptr, "a call's device checks"));
    const cudaError_t r = cudaEventQuery(checksCopied[i]);
    if (r == cudaErrorNotReady) break;
    if (r != cudaSuccess) {  // the device failed: these checks never arrive (the calls say so)
      checksPending = 0;
      break;
    }
    checksFirst = (i + 1) % kCheckSlots;
    --checksPending;
    const float* checks = hostChecks + 2 * i;
    if (checks[0] != 0.f || checks[1] != expectedOp[i]) {
      ++*rejected;
      if (checks[1] != expectedOp[i]) ++*opMismatches;
    }
  }
  return Err::Ok();
}

}  // namespace lowrank::cuda
