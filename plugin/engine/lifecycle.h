// The life of a buffer, written once for host and device buffers (docs/design.md, "A tensor's
// life"): whether a call is compressed, the reset on a change of count or dtype, the plan and its
// agreement between comm ranks, warm-up and exact-only buffers, the seed of the first Q, and the
// counters. Where the state lives and how a call runs is a backend's: the host engine
// (host_backend.h) or the CUDA backend (device_engine.h), behind BufferBackend.
// Not thread-safe: a communicator's calls are serialized (lowrankComm::callMu).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
  // their output is NaN), counted as they arrive, into *rejected. wait: lowrankCudaCollectArrived
  // (only what has arrived), lowrankCudaCollectForRoom (room for one more call) or
  // lowrankCudaCollectAll. Errors: a device wait that failed (timeout, NCCL error, abort).
  virtual Status collect(BackendState& state, const void* buf, int wait, uint64_t* rejected) {
    (void)state, (void)buf, (void)wait;
    *rejected = 0;
    return Status::Ok();
  }
};

// The state of tensors planned together: the plan, the backend's memory and the progress. An
// anonymous buffer (no ids) has one of its own; tensors declared with ids (lowrankBufferSetTensors)
// have one per declaration, which moves between buffers with them (engine/tensor_ids.cc).
struct Record {
  Plan plan;
  uint64_t calls = 0;        // calls since the plan was made
  bool haveQ = false;        // the state holds a Qbar from an earlier call (warm start)
  bool exactOnly = false;    // some comm rank could not allocate the state at plan time: every
                             // rank allreduces these tensors exactly until they are re-planned
  BufferBackend* backend = nullptr;     // whose state (null: none yet)
  std::unique_ptr<BackendState> state;  // null: nothing to compress, or exact-only
  // Declared with ids: the declaration it was planned for, each tensor's calls (its warm-up and
  // the draw of its first Q) and whether it was still in its warm-up then (planned exact), how
  // many of its ids it still holds, the buffer holding it (null: parked, held by no buffer) and
  // the registry's generation at which that buffer last found every id still its own.
  Layout layout;
  TensorIds decl;
  std::vector<uint64_t> tensorCalls;
  std::vector<bool> cold;
  size_t held = 0;
  const void* holder = nullptr;
  const void* gaveUp = nullptr;  // parked: the buffer that held it last (its release frees it)
  uint64_t verified = 0;
};

// A buffer's record, keyed by its address (recvbuff) within a communicator.
struct Buffer {
  std::optional<Layout> layout;  // from lowrankBufferSetLayout or SetTensors; survives resets
  TensorIds ids;                 // lowrankBufferSetTensors (empty: anonymous)
  bool declared = false;         // SetTensors since the last call: that call may take ids it holds not
  std::unique_ptr<Record> rec;   // null: not planned
  // Anonymous: a state restored (lowrankBufferRestoreState) and not yet installed: the next
  // compressible call plans the buffer with it. Set only while not planned; a reset drops it.
  std::unique_ptr<const SavedState> restored;
  bool planned() const { return rec != nullptr; }
};

class BufferRegistry {
 public:
  Buffer& get(const void* buf) { return map_[buf]; }
  Buffer* find(const void* buf);
  const Buffer* find(const void* buf) const;
  // Drops b's record and, with ids, the state of its declared ids wherever it is held and the
  // restores staged for them; keeps its declaration: the next call plans its tensors afresh.
  // Calls the backend rejected meanwhile are counted first.
  void reset(const void* buf, Buffer& b, Counters& k);
  // Drops b's record, the parked records b held last, and b itself (restores staged for its ids
  // stay: they belong to the ids).
  void erase(const void* buf, Counters& k);
  // Buffers holding a record (planned), and records no buffer holds that still hold ids.
  size_t held() const;
  uint64_t stateBytes() const;
  // lowrankBufferGetMemory of buf (the fields after `size`).
  void memory(const void* buf, lowrankMemoryInfo_t* info) const;
  // Every record of `backend` collects the rejections that have arrived (never blocks).
  void collectArrived(const BufferBackend& backend, Counters& k);

  // Tensor ids (engine/tensor_ids.cc). takeIds gives b, declared with ids, the record of its
  // tensors for call c: its own, another buffer's moved as is (same declaration), or a new one
  // made with each id's state copied in from where it is (collective: the plan check). Errors:
  // lowrankInvalidUsage naming an id another buffer took since b's last declaration; the plan's.
  Status takeIds(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
                 const EngineConfig& cfg, int rank, Counters& k);
  // The per-id state of b's declared tensors (format 2), wherever held. Errors:
  // lowrankInvalidUsage when none of them has any.
  Status saveIds(const Buffer& b, const EngineConfig& cfg, int rank, int nranks,
                 SavedTensors* out) const;
  // Stages each tensor's state for whichever buffer next plans its id.
  void stage(SavedTensors s);

 private:
  struct Owner {
    Record* rec;
    size_t index;
  };
  Status build(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
               const EngineConfig& cfg, int rank, Counters& k);
  void drop(std::unique_ptr<Record> r, Counters& k);  // frees r, giving up the ids it holds
  std::unique_ptr<Record> detach(Record* r);        // from its holder or the parked ones
  void dropIfEmpty(Record* r, Counters& k);          // a record that holds no id any more
  // The ids' state goes: their records give them up (a record left with none is freed; one that
  // keeps others is planned again at its buffer's next call), and so do restores staged for them.
  void disown(const std::vector<uint64_t>& ids, Counters& k);

  std::unordered_map<const void*, Buffer> map_;
  std::vector<std::unique_ptr<Record>> parked_;  // records no buffer holds, still holding ids
  std::unordered_map<uint64_t, Owner> owners_;   // id -> the record holding its state
  std::unordered_map<uint64_t, SavedTensor> pending_;  // restored, not yet installed
  uint64_t generation_ = 1;  // bumped when an id changes hands or a restore is staged
};

// True when a call of this dtype and op is compressed under cfg (sum or avg of a floating dtype
// PowerSGD handles, approximation rank > 0).
bool compresses(const EngineConfig& cfg, lowrankDataType_t dtype, lowrankRedOp_t op);

// The saved state of a planned anonymous buffer, or the one restored and not yet installed (the
// caller checks that one of them is there). cfg, rank, nranks: the communicator's.
Status saveBuffer(const Buffer& b, const EngineConfig& cfg, int rank, int nranks, SavedState* out);

// The state of plan pl (with compressed tensors) for call c, or null with a WARN naming the
// buffer and the bytes it could not get (the backend's failure, or the test hook
// EngineConfig::testFailAllocRank for this comm rank); or null with *refused saying why the
// supplied allocator refused (no WARN: the call fails, agreePlan). For anonymous buffers and
// tensors with ids.
std::unique_ptr<BackendState> allocateState(BufferBackend& be, const Plan& pl, const Call& c,
                                            const EngineConfig& cfg, int rank,
                                            std::optional<std::string>* refused);
// The plan check of a buffer's first call (PlanCheck), for anonymous buffers and tensors with ids:
// s is this rank's planning status, restoredId its restore's agreement id (0: none). Collective.
// A plan made exact-only (some comm rank could not allocate) counts in k.exactOnlyPlans, on every
// comm rank. refused: this rank's supplied allocator refused (why), else null. Errors: this
// rank's planning error, or lowrankInvalidUsage when the comm ranks differ; lowrankSystemError
// on every comm rank (Status::agreed) when some rank's supplied allocator refused.
Status agreePlan(BufferBackend& be, const Status& s, const Plan& pl, const Call& c, bool allocated,
                 uint64_t restoredId, uint64_t restoredCalls, bool* exactOnly, Counters& k,
                 const std::optional<std::string>& refused = std::nullopt);
// The INFO line of a record just planned.
void logPlanned(const Call& c, const Record& r);

// A format-1 state (saved by a buffer without ids) as the per-id states of b's declared tensors,
// which must have the saved layout. Errors: lowrankInvalidUsage saying what differs.
Status tensorsOfBuffer(const SavedState& s, const Buffer& b, const EngineConfig& cfg,
                       SavedTensors* out);

// One allreduce of buffer b on backend be: exact or compressed, planning, warm-up and counting.
// rank: this comm rank (the test hook that fails its allocations). scratchQ: room for a fresh Q.
// Errors: the backend's; a plan the comm ranks disagree on is lowrankInvalidUsage on every rank.
Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ);

}  // namespace lowrank
