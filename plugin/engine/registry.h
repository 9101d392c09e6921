// Where a communicator keeps its buffers and their tensors' state (docs/design.md, "A tensor's
// life"). Every buffer is a declaration: tensors declared with ids (lowrankBufferSetTensors), or,
// for a buffer without ids, synthetic ids (the positions of its layout's tensors, or 0 for a
// batched buffer) in a key space of that buffer's own, so that they never meet a caller's ids.
// One record holds the state of the tensors planned together; it moves between buffers with
// caller ids (FSDP allocates each step's gradients afresh) and stays with its buffer otherwise.
// Not thread-safe: a communicator's calls are serialized (lowrankComm::callMu).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/buffer_backend.h"
#include "engine/checkpoint.h"

namespace lowrank {

// A tensor's key: its id, in the key space of the caller's ids (space null) or of one buffer
// without ids (space: that buffer).
struct TensorKey {
  const void* space = nullptr;
  uint64_t id = 0;
  bool operator==(const TensorKey& o) const { return space == o.space && id == o.id; }
};
struct TensorKeyHash {
  size_t operator()(const TensorKey& k) const {
    return std::hash<uint64_t>()(mix(uint64_t(reinterpret_cast<uintptr_t>(k.space)), k.id));
  }
};

// The state of tensors planned together: the plan, the backend's memory and each tensor's progress.
struct Record {
  Plan plan;
  uint64_t calls = 0;        // calls since the plan was made
  bool qStep = false;        // alternating: the next compressed call is a Q step (P: kept in the
                             // state from the last call, a P step's Pbar), the same for all its tensors
  bool haveQ = false;        // the state holds a Qbar from an earlier call (warm start)
  bool exactOnly = false;    // some comm rank could not allocate the state at plan time: every
                             // rank allreduces these tensors exactly until they are re-planned
  BufferBackend* backend = nullptr;     // whose state (null: none yet)
  std::unique_ptr<BackendState> state;  // null: nothing to compress, or exact-only
  const void* space = nullptr;  // the key space of its ids (TensorKey)
  TensorIds decl;               // the declaration it was planned for
  Layout shapes;                // each tensor's shape ({count} for a batched buffer)
  std::vector<uint64_t> tensorCalls;  // each tensor's calls: its warm-up, its first Q's draw
  std::vector<bool> inWarmup;         // planned exact as still in its warm-up
  size_t idsHeld = 0;                 // of decl's ids, those whose state it still holds
  const void* heldBy = nullptr;       // the buffer holding it (null: parked, held by none)
  const void* lastHeldBy = nullptr;   // parked: the buffer that held it last (its release frees it)
  uint64_t checkedAt = 0;  // the registry's generation when heldBy last found every id its own
};

// A buffer's record, keyed by its address (recvbuff) within a communicator.
struct Buffer {
  std::optional<Layout> layout;  // from lowrankBufferSetLayout or SetTensors; survives resets
  // The declaration in force: the caller's, or synthetic (positions; one, 0, until a layout).
  TensorIds ids{{0}, {LOWRANK_RANK_DEFAULT}};
  bool synthetic = true;         // no lowrankBufferSetTensors: ids are positions (TensorKey)
  bool declared = false;         // SetTensors since the last call: that call may take ids it holds not
  int alternate = LOWRANK_ALTERNATE_DEFAULT;  // lowrankBufferSetAlternate
  std::unique_ptr<Record> rec;   // null: not planned
  bool alternates(const EngineConfig& cfg) const {
    return alternate == LOWRANK_ALTERNATE_DEFAULT ? cfg.alternate : alternate == 1;
  }
  bool planned() const { return rec != nullptr; }
  // Its tensors' shapes for a call of count elements: the layout, or one batched tensor.
  Layout shapes(size_t count) const { return layout ? *layout : Layout{Shape{count}}; }
};

class BufferRegistry {
 public:
  Buffer& get(const void* buf) { return map_[buf]; }
  Buffer* find(const void* buf);
  const Buffer* find(const void* buf) const;
  static const void* space(const void* buf, const Buffer& b) { return b.synthetic ? buf : nullptr; }
  // Drops b's record and the state of its ids wherever it is held, and (unless keepRestores) the
  // restores staged for them; keeps its declaration: the next call plans its tensors afresh.
  // Calls the backend rejected meanwhile are counted first.
  void reset(const void* buf, Buffer& b, Counters& k, bool keepRestores = false);
  // Drops b's record, the parked records b held last, b's synthetic ids' staged restores, and b
  // itself (restores staged for caller ids stay: they belong to the ids).
  void erase(const void* buf, Counters& k);
  // Buffers holding a record (planned), and records no buffer holds that still hold ids.
  size_t held() const;
  uint64_t stateBytes() const;
  // lowrankBufferGetMemory of buf (the fields after `size`).
  void memory(const void* buf, lowrankMemoryInfo_t* info) const;
  // Every record of `backend` collects the rejections that have arrived (never blocks).
  void collectArrived(const BufferBackend& backend, Counters& k);

  // Gives b the record of its tensors for call c: its own, another buffer's moved as is (same
  // caller declaration), or a new one made with each id's state copied in from where it is
  // (collective: the plan check). Errors: lowrankInvalidUsage naming an id another buffer took
  // since b's last declaration; the plan's.
  Status take(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
              const EngineConfig& cfg, int rank, Counters& k);
  // The per-id state of b's tensors (format 2), wherever held. Errors: lowrankInvalidUsage when
  // none of them has any.
  Status save(const void* buf, const Buffer& b, const EngineConfig& cfg, int rank, int nranks,
              SavedTensors* out) const;
  // Stages each tensor's state for whichever buffer next plans its id (in space).
  void stage(const void* space, SavedTensors s);

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
  void disown(const void* space, const std::vector<uint64_t>& ids, Counters& k,
              bool keepRestores = false);

  std::unordered_map<const void*, Buffer> map_;
  std::vector<std::unique_ptr<Record>> parked_;  // records no buffer holds, still holding ids
  std::unordered_map<TensorKey, Owner, TensorKeyHash> owners_;  // the record holding each state
  std::unordered_map<TensorKey, SavedTensor, TensorKeyHash> pending_;  // restored, not installed
  uint64_t generation_ = 1;  // bumped when an id changes hands or a restore is staged
};

// The synthetic declaration of a buffer without ids of n tensors: ids 0 .. n-1 at the default rank.
TensorIds positions(size_t n);

// A state by position for buffer b: as is for a buffer without ids, else each position's state
// under the id b declares there. Errors: lowrankInvalidUsage when b's layout is not the one saved.
Status byPosition(SavedTensors s, const Buffer& b, SavedTensors* out);

}  // namespace lowrank
