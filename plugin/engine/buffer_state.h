// Per-buffer state, keyed by the buffer's address (recvbuff) within a communicator: the layout the
// user gave, the plan, the residual E (float32), the factor buffers and the warm-start Qbar.
// Not thread-safe: a communicator's calls are serialized (see lowrank.h).
#pragma once
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/plan.h"

namespace lowrank {

struct BufferState {
  std::optional<Layout> layout;  // from lowrankBufferSetLayout; survives resets
  bool planned = false;
  Plan plan;
  std::vector<float> error;      // E, count floats, when error feedback is on
  std::vector<float> payload;    // allreduce #1: exact part | P of every compressed tensor | flag
  std::vector<float> qt;         // allreduce #2: Q^T of every compressed tensor; after the call, Qbar
  std::vector<float> qwire;      // pipelined: Q^T by column blocks, as the Q chunks travel
  bool haveQ = false;            // qt holds a Qbar from an earlier call (warm start)
  uint64_t calls = 0;            // calls since the plan was made
  bool exactOnly = false;        // some comm rank could not allocate the state at plan time: every
                                 // rank allreduces this buffer exactly until its count or dtype
                                 // changes, or it is reset

  // Drops plan, residual and factors; keeps the layout. The next call plans afresh.
  void reset();
  size_t bytes() const;
};

class BufferRegistry {
 public:
  BufferState& get(const void* buf) { return map_[buf]; }
  BufferState* find(const void* buf);
  void erase(const void* buf) { map_.erase(buf); }
  size_t size() const { return map_.size(); }
  size_t bytes() const;

 private:
  std::unordered_map<const void*, BufferState> map_;
};

}  // namespace lowrank
