#include "engine/cuda/device_state.h"

#include <algorithm>
#include <mutex>

#include "engine/cuda/cuda_status.h"
#include "engine/phases.h"
#include "kernels/cuda/dense_qr.h"
#include "util/log.h"

namespace lowrank::cuda {
namespace {

template <typename T>
Status deviceAlloc(T** p, size_t count, size_t* bytes) {
  if (count == 0) return Status::Ok();
  LR_CUDA(cudaMalloc(reinterpret_cast<void**>(p), count * sizeof(T)));
  *bytes += count * sizeof(T);
  return Status::Ok();
}

// Once per process, where a plan has a rank above 32: which orthonormalization serves it.
void reportDenseQr(const Plan& pl) {
  static std::once_flag once;
  if (std::none_of(pl.tensors.begin(), pl.tensors.end(),
                   [](const TensorPlan& t) { return t.compressed && t.k > 32; }))
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

Status event(cudaEvent_t* e) {
  LR_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  return Status::Ok();
}

BlockDesc rowBlockDesc(const TensorPlan& t, const RowBlock& rb, int N) {
  const size_t ld = t.view.stride(), skip = rb.r0 * ld;
  BlockDesc d;
  d.offset = t.offset + skip;
  d.valid = t.view.valid > skip ? t.view.valid - skip : 0;
  d.ld = ld;
  d.rows = uint32_t(rb.r1 - rb.r0);
  d.cols = uint32_t(t.view.cols);
  d.k = uint32_t(t.k);
  d.p = t.pOffset + rb.r0 * size_t(t.k);
  d.qt = t.qOffset;
  d.qld = t.view.cols;
  d.limit = phases::overflowLimit(t, N);
  return d;
}

BlockDesc colBlockDesc(const TensorPlan& t, const ColBlock& cb) {
  BlockDesc d;
  d.offset = t.offset + cb.c0;
  d.valid = t.view.valid > cb.c0 ? t.view.valid - cb.c0 : 0;
  d.ld = t.view.stride();
  d.rows = uint32_t(t.view.rows);
  d.cols = uint32_t(cb.c1 - cb.c0);
  d.k = uint32_t(t.k);
  d.p = t.pOffset;
  d.qt = cb.wireOffset;
  d.qld = cb.c1 - cb.c0;
  return d;
}

OrthoDesc pOrtho(const TensorPlan& t) {
  return OrthoDesc{t.pOffset, t.view.rows, uint32_t(t.k), uint64_t(t.k), 1};
}

}  // namespace

Status DeviceBuffer::allocate(const Plan& pl, bool errorFeedback, int N) {
  Status s = [&]() -> Status {
    if (errorFeedback) LR_RETURN_IF_ERROR(deviceAlloc(&e, pl.count, &bytes));
    LR_RETURN_IF_ERROR(deviceAlloc(&payload, pl.payloadElems(), &bytes));
    LR_RETURN_IF_ERROR(deviceAlloc(&qt, pl.qElems, &bytes));
    LR_RETURN_IF_ERROR(deviceAlloc(&wire, pl.qElems, &bytes));
    LR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&hostQ), std::max<size_t>(pl.qElems, 1) * sizeof(float)));
    LR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&hostChecks), kCheckSlots * 2 * sizeof(float)));
    for (cudaEvent_t* ev : {&exactReduced, &qCopied, &done}) LR_RETURN_IF_ERROR(event(ev));
    for (cudaEvent_t& ev : checksCopied) LR_RETURN_IF_ERROR(event(&ev));

    std::vector<ExactDesc> exacts;
    std::vector<OrthoDesc> qOrtho;
    for (const TensorPlan& t : pl.tensors) {
      if (!t.compressed) exacts.push_back({t.offset, t.numel, t.exactOffset});
      else qOrtho.push_back({t.qOffset, t.view.cols, uint32_t(t.k), 1, t.view.cols});
    }
    LR_CUDA(createExactTable(exacts.data(), exacts.size(), &exact));
    reportDenseQr(pl);
    LR_CUDA(createOrthoTable(qOrtho.data(), qOrtho.size(), &orthoQ));

    pChunks.resize(pl.pChunks.size());
    for (size_t c = 0; c < pl.pChunks.size(); ++c) {
      std::vector<BlockDesc> blocks;
      for (size_t b = pl.pChunks[c].first; b < pl.pChunks[c].last; ++b) {
        const RowBlock& rb = pl.rowBlocks[b];
        blocks.push_back(rowBlockDesc(pl.tensors[rb.tensor], rb, N));
      }
      LR_CUDA(createBlockTable(blocks.data(), blocks.size(), &pChunks[c].blocks));
      LR_RETURN_IF_ERROR(event(&pChunks[c].computed));
      LR_RETURN_IF_ERROR(event(&pChunks[c].reduced));
    }

    // Q chunks: the blocks, and the tensors whose P is first needed by this chunk.
    std::vector<char> seen(pl.tensors.size(), 0);
    std::vector<BlockDesc> all;
    std::vector<uint64_t> dstOffset, dstLd;
    qChunks.resize(pl.qChunks.size());
    for (size_t c = 0; c < pl.qChunks.size(); ++c) {
      QChunkState& q = qChunks[c];
      std::vector<BlockDesc> blocks;
      std::vector<OrthoDesc> first;
      for (size_t b = pl.qChunks[c].first; b < pl.qChunks[c].last; ++b) {
        const ColBlock& cb = pl.colBlocks[b];
        const TensorPlan& t = pl.tensors[cb.tensor];
        blocks.push_back(colBlockDesc(t, cb));
        all.push_back(blocks.back());
        dstOffset.push_back(t.qOffset + cb.c0);
        dstLd.push_back(t.view.cols);
        if (!seen[cb.tensor]) {
          seen[cb.tensor] = 1;
          first.push_back(pOrtho(t));
          q.waitPChunk = q.waitPChunk == SIZE_MAX ? t.lastPChunk : std::max(q.waitPChunk, t.lastPChunk);
        }
      }
      LR_CUDA(createBlockTable(blocks.data(), blocks.size(), &q.blocks));
      if (!first.empty()) LR_CUDA(createOrthoTable(first.data(), first.size(), &q.ortho));
      LR_RETURN_IF_ERROR(event(&q.computed));
      LR_RETURN_IF_ERROR(event(&q.reduced));
    }
    LR_CUDA(createScatterTable(all.data(), dstOffset.data(), dstLd.data(), all.size(), &scatter));
    // The factor buffers start at zero, as on the host (padding of P is never written by pass 1).
    LR_CUDA(cudaMemset(payload, 0, pl.payloadElems() * sizeof(float)));
    if (e) LR_CUDA(cudaMemset(e, 0, pl.count * sizeof(float)));
    return Status::Ok();
  }();
  if (!s.ok()) release();
  return s;
}

void DeviceBuffer::release() {
  if (done) cudaEventSynchronize(done);  // the last call that used this memory has finished
  for (void* p : {static_cast<void*>(e), static_cast<void*>(payload), static_cast<void*>(qt),
                  static_cast<void*>(wire)})
    if (p) cudaFree(p);
  if (hostQ) cudaFreeHost(hostQ);
  if (hostChecks) cudaFreeHost(hostChecks);
  if (exact) destroy(exact);
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
  for (cudaEvent_t ev : {exactReduced, qCopied, done}) if (ev) cudaEventDestroy(ev);
  for (cudaEvent_t ev : checksCopied) if (ev) cudaEventDestroy(ev);
  *this = DeviceBuffer();  // checks still pending are dropped (CudaEngine collects them first)
}

}  // namespace lowrank::cuda
