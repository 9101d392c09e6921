// The life of a buffer, written once for host and device buffers (docs/design.md, "A buffer's
// life"): whether a call is compressed, the reset on a change of count or dtype, the plan and its
// agreement between comm ranks, warm-up and exact-only buffers, the seed of the first Q, and the
// counters. Where the state lives and how a call runs is a backend's: the host engine
// (host_backend.h) or the CUDA backend (device_engine.h), behind BufferBackend.
// Not thread-safe: a communicator's calls are serialized (lowrankComm::callMu).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "abi/cuda_backend.h"  // lowrankCudaCollect*: how long collect() waits
#include "engine/checkpoint.h"
#include "engine/engine_config.h"
#include "engine/plan.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

// The counters of lowrankGetStats that the engine keeps, for host and device buffers alike.
struct Counters {
  uint64_t calls = 0, compressedCalls = 0, fallbackCalls = 0;
  uint64_t compressedElements = 0, exactElements = 0, payloadElements = 0;
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
};

class BufferBackend {
 public:
  virtual ~BufferBackend() = default;
  // The allreduce as is, uncompressed.
  virtual Status exact(const Call& c) = 0;
  // The plan agreement: words max-allreduced in place over the communicator (PlanCheck).
  virtual Status agree(uint64_t words[PlanCheck::kWords]) = 0;
  // The state of a plan with compressed tensors, zeroed; null when the memory could not be had
  // (said why at INFO): the plan agreement then makes the buffer exact-only on every comm rank.
  virtual std::unique_ptr<BackendState> allocate(const Plan& plan, const void* buf) = 0;
  // One compressed call of a planned buffer. freshQ: the initial Qt of every compressed tensor
  // (plan.qElems floats, orthonormal; read before the call returns), or null for the warm start
  // (the last call's Qbar, orthonormalized by the backend). *fellBack: some comm rank's input was
  // non-finite, found before anything was written (the host); the caller then makes the call
  // exact. On error the state may be half updated: the caller drops it.
  virtual Status compressed(BackendState& state, const Plan& plan, const Call& c,
                            const float* freshQ, bool* fellBack) = 0;
  // Checkpoint: copies the state's residual (plan.count floats; none when `residual` is null or error
  // feedback is off) and Qt (plan.qElems floats, whole-tensor layout) to host memory (save), or
  // from it (load), after the buffer's last call. A failed load leaves the state to be dropped.
  virtual Status save(BackendState& state, const Plan& plan, float* residual, float* qt) = 0;
  virtual Status load(BackendState& state, const Plan& plan, const float* residual,
                      const float* qt) = 0;
  // True once a collective of this backend failed midway (any error of the transport or of NCCL
  // during a collective): the comm ranks may be out of step, so the communicator fails. The same
  // notion for both backends: the transport's broken() (transport/transport.h), or an NCCL error
  // the CUDA backend reported.
  virtual bool broken() const = 0;
  // Calls rejected after they returned (the device's non-finite and op checks, which arrive later;
  // their output is NaN), counted as they arrive. wait: lowrankCudaCollectArrived (only what has
  // arrived), lowrankCudaCollectForRoom (room for one more call) or lowrankCudaCollectAll.
  virtual uint64_t collect(BackendState& state, const void* buf, int wait) {
    (void)state, (void)buf, (void)wait;
    return 0;
  }
};

// A buffer's record, keyed by its address (recvbuff) within a communicator.
struct Buffer {
  std::optional<Layout> layout;  // from lowrankBufferSetLayout; survives resets
  bool planned = false;
  Plan plan;
  uint64_t calls = 0;        // calls since the plan was made
  bool haveQ = false;        // the state holds a Qbar from an earlier call (warm start)
  bool exactOnly = false;    // some comm rank could not allocate the state at plan time: every
                             // rank allreduces this buffer exactly until it is re-planned
  BufferBackend* backend = nullptr;     // whose state (null: none yet)
  std::unique_ptr<BackendState> state;  // null: nothing to compress, exact-only, or not planned
  // A state restored (lowrankBufferRestoreState) and not yet installed: the next compressible call
  // plans the buffer with it. Set only while not planned; a reset drops it.
  std::unique_ptr<const SavedState> restored;
};

class BufferRegistry {
 public:
  Buffer& get(const void* buf) { return map_[buf]; }
  Buffer* find(const void* buf);
  const Buffer* find(const void* buf) const;
  // Drops b's plan and state (keeps the layout): the next call plans afresh. Calls the backend
  // rejected meanwhile are counted first.
  void reset(const void* buf, Buffer& b, Counters& k);
  void erase(const void* buf, Counters& k);
  size_t size() const { return map_.size(); }
  uint64_t stateBytes() const;
  // Every buffer of `backend` collects the rejections that have arrived (never blocks).
  void collectArrived(const BufferBackend& backend, Counters& k);

 private:
  std::unordered_map<const void*, Buffer> map_;
};

// True when a call of this dtype and op is compressed under cfg (sum or avg of a floating dtype
// PowerSGD handles, approximation rank > 0).
bool compresses(const EngineConfig& cfg, lowrankDataType_t dtype, lowrankRedOp_t op);

// The saved state of a planned buffer, or the one restored and not yet installed (the caller
// checks that one of them is there). cfg, rank, nranks: the communicator's.
Status saveBuffer(const Buffer& b, const EngineConfig& cfg, int rank, int nranks, SavedState* out);

// One allreduce of buffer b on backend be: exact or compressed, planning, warm-up and counting.
// rank: this comm rank (the test hook that fails its allocations). scratchQ: room for a fresh Q.
// Errors: the backend's; a plan the comm ranks disagree on is lowrankInvalidUsage on every rank.
Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ);

}  // namespace lowrank
