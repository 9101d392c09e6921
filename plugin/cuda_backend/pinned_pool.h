// Pinned host memory of one communicator (issue 39): cudaMallocHost and cudaFreeHost synchronize
// the device, so a buffer planned during training (a rebucketing) must not call them, nor a
// buffer released then. Blocks are carved from slabs (one cudaMallocHost serves many buffers),
// handed back with an event of the stream that last uses them and reused once it has completed
// (polled, never waited for), and given back to CUDA only when the communicator is destroyed.
// Not thread-safe: the communicator's calls are serialized.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "cuda_backend/cuda_status.h"

namespace lowrank::cuda {

class PinnedPool {
 public:
  PinnedPool() = default;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A block of at least `bytes`, free of any earlier use: one handed back whose event has
  // completed, else one carved from a new slab (the only cudaMallocHost; a slab holds
  // kSlabBytes / size of the small blocks, one large block otherwise).
  // *got (may be null): the block's bytes.
  Err take(size_t bytes, void** out, size_t* got = nullptr);
  // Hands p (from take) back: reusable once the work queued on `stream` so far has run (an event
  // recorded there; null: at once). A failure to record keeps the block out of use for good.
  void give(void* p, cudaStream_t stream);
  // Whether every block handed back is free (their events completed): the device no longer
  // writes into any of them.
  bool settled();
  // cudaFreeHost of every slab (the communicator's teardown, after settled()).
  void freeAll();

  static constexpr size_t kSlabBytes = 64 * 1024;

 private:
  struct Block {
    char* p = nullptr;
    size_t bytes = 0;
    bool inUse = false;
    bool lost = false;                // its event could not be recorded: never reused
    cudaEvent_t after = nullptr;      // reusable once it completed (null: now)
  };
  bool ready(Block& b);  // free and its event completed (destroyed then)
  std::vector<Block> blocks_;
  std::vector<void*> slabs_;
};

}  // namespace lowrank::cuda
