#include "cuda_backend/pinned_pool.h"

#include <algorithm>

namespace lowrank::cuda {
namespace {

size_t sizeClass(size_t bytes) {
  size_t c = 64;  // a cache line: blocks of one slab never share one
  while (c < bytes) c *= 2;
  return c;
}

}  // namespace

bool PinnedPool::ready(Block& b) {
  if (b.inUse || b.lost) return false;
  if (!b.after) return true;
  const cudaError_t q = cudaEventQuery(b.after);
  if (q == cudaErrorNotReady) return false;
  if (q != cudaSuccess) {  // the device failed: nothing runs any more, but keep it out of use
    b.lost = true;
    return false;
  }
  cudaEventDestroy(b.after);
  b.after = nullptr;
  return true;
}

Err PinnedPool::take(size_t bytes, void** out, size_t* got) {
  const size_t size = sizeClass(std::max<size_t>(bytes, 1));
  Block* best = nullptr;
  for (Block& b : blocks_)
    if (b.bytes >= size && (!best || b.bytes < best->bytes) && ready(b)) best = &b;
  if (!best) {
    const size_t slab = std::max(size, kSlabBytes);
    void* p = nullptr;
    LR_CUDA(cudaMallocHost(&p, slab));
    slabs_.push_back(p);
    const size_t first = blocks_.size();
    for (size_t off = 0; off + size <= slab; off += size)
      blocks_.push_back(Block{static_cast<char*>(p) + off, size});
    best = &blocks_[first];
  }
  best->inUse = true;
  *out = best->p;
  if (got) *got = best->bytes;
  return Err::Ok();
}

void PinnedPool::give(void* p, cudaStream_t stream) {
  if (!p) return;
  for (Block& b : blocks_) {
    if (b.p != p) continue;
    b.inUse = false;
    if (!stream) return;
    if (cudaEventCreateWithFlags(&b.after, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(b.after, stream) != cudaSuccess)
      b.lost = true;
    return;
  }
}

bool PinnedPool::settled() {
  for (Block& b : blocks_)
    if (!b.inUse && !b.lost && !ready(b)) return false;
  return std::none_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.lost; });
}

void PinnedPool::freeAll() {
  for (Block& b : blocks_)
    if (b.after) cudaEventDestroy(b.after);
  for (void* p : slabs_) cudaFreeHost(p);
  blocks_.clear();
  slabs_.clear();
}

}  // namespace lowrank::cuda
