// What the shim gives lowrank, decided from the calls alone (no NCCL, no lowrank: tested apart).
//
// A call is eligible when its dtype is float32, float16 or bfloat16, its op sum or avg (or a
// premulsum whose host scalar makes it one of those), and count * size >= LOWRANK_MIN_BYTES.
// Eligible calls of a communicator form a sequence; SequencePolicy tells the shim's buffers apart:
// it hands lowrank only the calls of a recurring cycle, where an address carries one tensor per
// step. Once the sequence has repeated identically kRepeats times in a row (a cycle of length L
// seen that many times), the calls of the next repetitions go to lowrank, which keeps their state
// and applies its own per-buffer warm-up (lowrankConfig_t.startIter, LOWRANK_START_ITER). A call
// that breaks the cycle passes through exactly and detection starts again (so one-off calls, and
// calls after a change, stay exact until the new cycle has repeated kRepeats times). The state of
// a buffer is dropped when its address comes back under another key, when a newly adopted cycle
// no longer has it, or has it between other neighbours: state never follows a reused address into
// a different bucket. A buffer that appears twice in one cycle is never handed to lowrank (one
// residual cannot serve two tensors).
//
// Every comm rank makes the same calls in the same order (NCCL requires it) and, in the programs
// this is for (DDP, FSDP, XLA), reuses its buffers in the same pattern, so every comm rank takes
// the same decisions at the same call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lowrank/lowrank.h"

namespace lowrank::shim {

// ncclRedOp_t numbers (lowrank.h's enum uses the same; dtypes: plugin/util/dtype.h).
enum : int { kSum = 0, kAvg = 4, kNumBuiltinOps = 5 };

// A premulsum op made with a host scalar (ncclRedOpCreatePreMulSum, ncclScalarHostImmediate):
// the scalar as stored (dtype's bytes) and its dtype.
struct PreMulSum {
  int dtype = lowrankFloat32;  // ncclDataType_t number
  unsigned char value[8] = {};
};

// The scalar of a premulsum as a double (float16, bfloat16, float32, float64); nullopt for others.
std::optional<double> preMulScalar(const PreMulSum& p);

// The lowrank op (kSum or kAvg) that computes `op` on `nranks` comm ranks, or nullopt.
// Built-in ops map to themselves when sum or avg. A premulsum maps to sum when its scalar is 1 and
// to avg when it equals 1/nranks rounded to its dtype; `premul` is its record (null: unknown op,
// e.g. one with a device scalar).
std::optional<int> mapOp(int op, const PreMulSum* premul, int nranks);

// True when dtype and byte size make a call compressible (op already mapped).
bool eligible(int dtype, size_t count, uint64_t minBytes);

// One eligible call, as seen by the sequence detection (sendbuff matters only as in-place or not:
// state is kept per recvbuff).
struct CallKey {
  const void* recv = nullptr;
  bool inPlace = true;
  size_t count = 0;
  int dtype = 0;
  int op = 0;  // mapped op
  bool operator==(const CallKey& o) const {
    return recv == o.recv && inPlace == o.inPlace && count == o.count && dtype == o.dtype &&
           op == o.op;
  }
  bool operator!=(const CallKey& o) const { return !(*this == o); }
};
struct CallKeyHash {
  size_t operator()(const CallKey& k) const;
};

class SequencePolicy {
 public:
  // Complete repetitions of a cycle seen in a row before its calls go to lowrank: the candidate is
  // found when its first call comes back; one whole repetition more confirms it. Fixed, and
  // independent of LOWRANK_START_ITER (the engine's warm-up, counted per buffer).
  static constexpr int kRepeats = 2;

  // maxCycle: the longest cycle searched.
  explicit SequencePolicy(size_t maxCycle = 4096);

  struct Decision {
    bool compress = false;             // give the call to lowrank (not the real NCCL)
    std::vector<const void*> release;  // buffers whose state to drop before this call
    bool started = false;              // this call starts giving lowrank a new cycle
    bool changed = false;              // this call broke the cycle being verified or compressed
  };
  Decision next(const CallKey& k);

  size_t cycleLength() const { return cycle_.size(); }
  int repeats() const { return repeats_; }
  bool compressing() const { return !cycle_.empty() && repeats_ >= kRepeats && adopted_; }
  size_t statefulBuffers() const { return stateful_.size(); }

 private:
  void append(const CallKey& k);
  bool searchCycle(const CallKey& k);  // a new candidate cycle ending at this call
  void adopt(Decision* d);             // the candidate becomes the compressed cycle

  const size_t maxCycle_;
  std::vector<CallKey> hist_;                                // calls since hist_base_
  uint64_t histBase_ = 0;                                    // index of hist_[0]
  std::unordered_map<CallKey, uint64_t, CallKeyHash> last_;  // last index of each key
  std::vector<CallKey> cycle_;                               // the candidate or compressed cycle
  size_t pos_ = 0;                                           // next expected cycle_[pos_]
  int repeats_ = 0;                                          // complete repetitions seen
  bool adopted_ = false;                                     // cycle_ is the compressed one
  std::vector<CallKey> active_;  // the last adopted cycle (state was made under it)
  std::unordered_set<const void*> shared_;  // recvbuffs found twice in active_
  std::unordered_map<const void*, CallKey> stateful_;  // buffers with state, and their key
};

}  // namespace lowrank::shim
