// The state of one device buffer: its plan (made on the host, as for host buffers), the device
// memory of its residual and factors, the launch tables of its chunks, and the events that chain
// the compute (the caller's stream) with the communication stream. Owned by CudaEngine.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "engine/plan.h"
#include "kernels/cuda/powersgd_kernels.h"
#include "util/status.h"

namespace lowrank::cuda {

// Per P chunk and per Q chunk: the blocks of one launch, and the events around its allreduce.
struct PChunkState {
  BlockTable* blocks = nullptr;
  cudaEvent_t computed = nullptr, reduced = nullptr;
};
struct QChunkState {
  BlockTable* blocks = nullptr;
  OrthoTable* ortho = nullptr;   // tensors whose P is first needed here (null: none)
  size_t waitPChunk = SIZE_MAX;  // the last P chunk those tensors need reduced
  cudaEvent_t computed = nullptr, reduced = nullptr;
};

struct DeviceBuffer {
  Plan plan;
  bool planned = false;
  bool exactOnly = false;  // some comm rank could not allocate: every call is exact
  uint64_t calls = 0;      // calls since the plan was made
  bool haveQ = false;      // qt holds a Qbar (warm start)

  float* e = nullptr;        // residual E (count floats), null without error feedback
  float* payload = nullptr;  // exact part | P | non-finite count | op
  float* qt = nullptr;       // Qt of every compressed tensor (whole-tensor layout)
  float* wire = nullptr;     // Qt by column blocks, as the Q chunks travel
  float* hostQ = nullptr;    // pinned: a fresh initial Q drawn on the host

  ExactTable* exact = nullptr;
  OrthoTable* orthoQ = nullptr;   // every compressed tensor's Qt (warm start)
  ScatterTable* scatter = nullptr;
  std::vector<PChunkState> pChunks;
  std::vector<QChunkState> qChunks;
  cudaEvent_t exactReduced = nullptr, qCopied = nullptr, done = nullptr;

  // The reduced [non-finite count, op] of each compressed call, copied to the host for the
  // engine to count rejected calls. The host queues calls faster than their checks arrive, so
  // every call in flight needs its own pinned slot and event (one shared slot let the next call
  // overwrite a rejection before it was counted): a ring, collected oldest first. A call that
  // finds every slot pending waits for the oldest (the host is then kCheckSlots calls ahead).
  static constexpr size_t kCheckSlots = 4;
  float* hostChecks = nullptr;                  // pinned: kCheckSlots x [non-finite count, op]
  cudaEvent_t checksCopied[kCheckSlots] = {};   // slot i holds its call's checks once completed
  float expectedOp[kCheckSlots] = {};           // what slot i's op word must be for its call
  size_t checksFirst = 0, checksPending = 0;    // the oldest pending slot; how many are pending
  size_t bytes = 0;                             // device memory held

  // Allocates everything for `plan`. On failure frees what was allocated and returns the error.
  Status allocate(const Plan& plan, bool errorFeedback, int nranks);
  // Frees everything (waits for the buffer's last call first). Keeps nothing but nothing.
  void release();
};

}  // namespace lowrank::cuda
