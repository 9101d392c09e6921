// What the life of a buffer (engine/lifecycle.h) asks of a backend, host or device: one call as
// the engine sees it, the state of a plan in the backend's memory, and the operations on it; and
// the counters the engine keeps for lowrankGetStats.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "abi/cuda_backend.h"  // lowrankCudaCollect*: how long collect() waits
#include "engine/engine_config.h"
#include "engine/plan.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

// The counters of lowrankGetStats that the engine keeps, for host and device buffers alike.
struct Counters {
  uint64_t calls = 0, compressedCalls = 0, fallbackCalls = 0;
  uint64_t compressedElements = 0, exactElements = 0, payloadElements = 0;
  uint64_t exactOnlyPlans = 0;  // plans agreed exact-only (agreePlan)
  uint64_t rankChanges = 0;     // tensors planned with another declared rank (BufferRegistry::build)
};

// One allreduce as the engine sees it, arguments checked by the API layer. stream: a cudaStream_t
// for device buffers, null for host ones.
struct Call {
  const void* send;
  void* recv;
  size_t count;
  lowrankDataType_t dtype;
  lowrankRedOp_t op;
  void* stream;
};

// A planned buffer's memory in a backend (residual, factors; host vectors or device memory).
class BackendState {
 public:
  virtual ~BackendState() = default;  // frees the memory (a device state waits for its last call)
  virtual uint64_t bytes() const = 0;
  // lowrankBufferGetMemory's fields after `size` and `planned` (docs/cuda.md, "Memory").
  virtual void memory(lowrankMemoryInfo_t* info) const = 0;
};

class BufferBackend {
 public:
  virtual ~BufferBackend() = default;
  // The allreduce as is, uncompressed.
  virtual Status exact(const Call& c) = 0;
  // The plan agreement: words max-allreduced in place over the communicator (PlanCheck).
  virtual Status agree(uint64_t words[PlanCheck::kWords]) = 0;
  // The state of a plan with compressed tensors, zeroed; null when the memory could not be had,
  // with *why saying what failed (the caller warns: allocateState): the plan agreement then makes
  // the buffer exact-only on every comm rank; or, *refused set, the supplied allocator refused it
  // (cfg.allocator, given c.stream): the call then fails on every comm rank (agreePlan).
  virtual std::unique_ptr<BackendState> allocate(const Plan& plan, const Call& c,
                                                 const EngineConfig& cfg, std::string* why,
                                                 bool* refused) = 0;
  // The bytes allocate takes for plan (what lowrankStats_t.stateBytes counts): Plan::stateBytes,
  // and what this backend keeps beside it.
  virtual uint64_t stateBytes(const Plan& plan, bool errorFeedback) const {
    return plan.stateBytes(errorFeedback);
  }
  // One compressed call of a planned buffer. freshQ: the initial Qt of every compressed tensor
  // (plan.qElems floats, orthonormal; read before the call returns), or null for the warm start
  // (the last call's Qbar, orthonormalized by the backend). *fellBack: some comm rank's input was
  // non-finite, found before anything was written (the host); the caller then makes the call
  // exact. On error the state may be half updated: the caller drops it. qStep: an alternating
  // plan's (plan.alternate) step, a Q step against the kept P, else a P step against the kept Q.
  virtual Status compressed(BackendState& state, const Plan& plan, const Call& c,
                            const float* freshQ, bool qStep, bool* fellBack) = 0;
  // Checkpoint: copies the state's residual (plan.count floats; none when `residual` is null or error
  // feedback is off), Qt (plan.qElems floats, whole-tensor layout) and, p not null, the P area of
  // the payload (plan.pElems floats: an alternating plan's kept Pbar) to host memory (save), or
  // from it (load), after the buffer's last call. A failed load leaves the state to be dropped.
  virtual Status save(BackendState& state, const Plan& plan, float* residual, float* qt,
                      float* p) = 0;
  virtual Status load(BackendState& state, const Plan& plan, const float* residual,
                      const float* qt, const float* p) = 0;
  // True once a collective of this backend failed midway (any error of the transport or of NCCL
  // during a collective): the comm ranks may be out of step, so the communicator fails. The same
  // notion for both backends: the transport's broken() (transport/transport.h), or an NCCL error
  // the CUDA backend reported.
  virtual bool broken() const = 0;
  // Calls rejected after they returned (the device's non-finite and op checks, which arrive later;
  // their output is NaN), counted as they arrive, into *rejected. wait: lowrankCudaCollectArrived
  // (only what has arrived), lowrankCudaCollectForRoom (room for one more call) or
  // lowrankCudaCollectAll. Errors: a device wait that failed (timeout, NCCL error, abort).
  virtual Status collect(BackendState& state, const void* buf, int wait, uint64_t* rejected) {
    (void)state, (void)buf, (void)wait;
    *rejected = 0;
    return Status::Ok();
  }
};

}  // namespace lowrank
