// The state of one device buffer: what the device needs of its plan (made by liblowrank and
// described in plain C, abi/cuda_backend.h), the device memory of its residual and factors, the
// launch tables of its chunks, its compute stream, and the events that chain that stream with the
// caller's and with the communication stream. Behind the table's lowrankCudaState_t.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "abi/cuda_backend.h"
#include "cuda_backend/cuda_status.h"
#include "kernels/cuda/powersgd_kernels.h"

namespace lowrank::cuda {

struct DeviceComm;  // device_schedule.h

// Per P chunk and per Q chunk: the blocks of one launch, the floats allreduced (payload or wire
// [offset, offset + count)), and the events around its allreduce.
struct PChunkState {
  BlockTable* blocks = nullptr;
  size_t offset = 0, count = 0;
  cudaEvent_t computed = nullptr, reduced = nullptr;
};
struct QChunkState {
  BlockTable* blocks = nullptr;
  size_t offset = 0, count = 0;
  OrthoTable* ortho = nullptr;   // tensors whose P is first needed here (null: none)
  size_t waitPChunk = SIZE_MAX;  // the last P chunk those tensors need reduced
  cudaEvent_t computed = nullptr, reduced = nullptr;
};

struct DeviceBuffer {
  // The plan as liblowrank described it, the one translation of its Plan (its numbers; the arrays
  // it pointed to were read into the launch tables below and are not kept).
  lowrankCudaPlan_t plan{};
  const DeviceComm* comm = nullptr;  // whose waits bound this buffer's (device_wait.h)

  // The buffer's own stream for the passes (non-blocking): a call forks it from the caller's
  // stream (`forked`) and joins the caller's stream to it once, at the end (`done`), so that the
  // caller's later work never waits on this buffer's allreduces mid-call, and another buffer's
  // pass 1 runs while this one's factors travel (issue 26, item 1). Set-up copies and memsets are
  // ordered on it too (never a pageable copy racing it).
  cudaStream_t compute = nullptr;

  float* e = nullptr;        // residual E (count floats), null without error feedback
  float* payload = nullptr;  // exact part | P | non-finite count | op
  float* qt = nullptr;       // Qt of every compressed tensor (whole-tensor layout)
  float* wire = nullptr;     // Qt by column blocks, as the Q chunks travel
  // 16-bit factors (plan.factorDtype bfloat16 or float16): the factors as they travel, 2 bytes per
  // element of the larger factor area (P or Q; a chunk's at its factors' own place), counted in
  // memory.workspace. Null for float32 factors.
  uint16_t* wire16 = nullptr;

  ExactTable* exact = nullptr;
  OrthoTable* orthoQ = nullptr;   // every compressed tensor's Qt (warm start)
  ScatterTable* scatter = nullptr;
  std::vector<PChunkState> pChunks;
  std::vector<QChunkState> qChunks;
  cudaEvent_t exactReduced = nullptr, done = nullptr, forked = nullptr;

  // The reduced [non-finite count, op] of each compressed call, copied to the host for the
  // engine to count rejected calls. The host queues calls faster than their checks arrive, so
  // every call in flight needs its own pinned slot and event (one shared slot let the next call
  // overwrite a rejection before it was counted): a ring, collected oldest first. A call that
  // finds every slot pending waits for the oldest (the host is then kCheckSlots calls ahead).
  static constexpr size_t kCheckSlots = 4;
  float* hostChecks = nullptr;  // pinned (the comm's pool): kCheckSlots x [non-finite count, op]
  cudaEvent_t checksCopied[kCheckSlots] = {};   // slot i holds its call's checks once completed
  float expectedOp[kCheckSlots] = {};           // what slot i's op word must be for its call
  size_t checksFirst = 0, checksPending = 0;    // the oldest pending slot; how many are pending
  size_t bytes = 0;                             // device memory of e, payload, qt, wire, wire16
  lowrankCudaMemory_t memory{};                 // every byte held, by kind (lowrankBufferGetMemory)
  // Where the device memory comes from (lowrankCommSetAllocator's; none: CUDA's), and where it
  // goes back: the tables keep their own copy.
  DeviceAllocator allocator;
  bool supplied() const { return allocator.alloc != nullptr; }
  bool streamOrdered() const;  // frees in the compute stream's order (pools or the allocator)

  // Allocates everything for `plan` on comm and zeroes the residual and factors, all ordered on
  // the buffer's new stream (cudaMallocAsync, copies queued there; pinned blocks from the comm's
  // pool): no synchronizing call where the device has memory pools (DeviceComm::asyncAlloc). With
  // a supplied allocator (a.alloc set) every byte of device memory is its, taken for the order of
  // callStream (the planning call's), which the buffer's stream then waits for. On failure frees
  // what was allocated and returns the error (refused: the allocator's).
  Err allocate(const lowrankCudaPlan_t& plan, const DeviceComm& comm,
               const lowrankCudaAllocator_t& a, cudaStream_t callStream);
  // Frees everything, never waiting on the host where comm.asyncAlloc or the memory is the
  // supplied allocator's: the device memory by cudaFreeAsync (or the allocator's free) on the
  // buffer's stream after its last call and after the communication stream's work so far, the
  // pinned blocks back to the pool once that has run, the stream destroyed (its work still runs).
  // Memory a call that never finishes uses is never freed, as it must not be. Without memory
  // pools: once the last call has finished (settleDevice), else left allocated with a WARN.
  // Checks still pending are dropped.
  void release();
  // Counts the rejected calls among the checks that have arrived, oldest first, into *rejected;
  // waits for the oldest `wait` of them (0: never blocks; SIZE_MAX: all). *opMismatches: those
  // rejected because the comm ranks used different ops. Errors: a failed wait (waitDevice).
  Err collectChecks(size_t wait, uint32_t* rejected, uint32_t* opMismatches);
};

}  // namespace lowrank::cuda
