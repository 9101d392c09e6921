// Fuzz target: the NCCL shim's sequence detection (plugin/nccl_shim/policy.cc) on call streams
// over a few buffers, counts and dtypes, with repeats, one-off calls and changes. Checks the
// documented promises: a call is given to lowrank only inside a cycle that has repeated
// SequencePolicy::kRepeats times, never for a buffer used twice in that cycle, and a buffer's
// state is never carried to a call with another key (or released when it has none).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "nccl_shim/policy.h"
#include "tests/fuzz/fuzz_input.h"

using namespace lowrank::shim;

namespace {

constexpr const char* kName = "policy";
#define CHECK(cond) FUZZ_CHECK(kName, cond, #cond)

char arena[8];

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lowrank::fuzz::Input in(data, size);
  const size_t maxCycle = in.range(1, 12);
  SequencePolicy policy(maxCycle);
  constexpr size_t kRepeats = SequencePolicy::kRepeats;
  std::vector<CallKey> hist;
  std::map<const void*, CallKey> stateful;  // the model of the policy's per-buffer state
  // A stream: mostly repeats of a short pattern, sometimes a random call (a change, a one-off).
  std::vector<CallKey> pattern(in.range(1, 6));
  auto randomKey = [&] {
    return CallKey{arena + in.range(0, 5), in.byte() >= 32, size_t(1024) * in.range(1, 3),
                   in.byte() < 32 ? lowrankBfloat16 : lowrankFloat32, kSum};
  };
  for (CallKey& k : pattern) k = randomKey();
  for (size_t step = 0; !in.empty() && step < 400; ++step) {
    const uint8_t what = in.byte();
    const CallKey k = what < 24 ? randomKey() : pattern[step % pattern.size()];
    if (what >= 24 && what < 28) pattern[in.range(0, pattern.size() - 1)] = randomKey();

    const SequencePolicy::Decision d = policy.next(k);
    hist.push_back(k);
    const size_t i = hist.size() - 1;
    for (size_t r = 0; r < d.release.size(); ++r) {
      CHECK(stateful.count(d.release[r]));  // only state that exists is released, once
      stateful.erase(d.release[r]);
    }
    auto st = stateful.find(k.recv);
    CHECK(st == stateful.end() || st->second == k);  // state never changes hands between keys
    if (d.compress) {
      stateful[k.recv] = k;
      const size_t L = policy.cycleLength();
      CHECK(L >= 1 && L <= maxCycle && i >= kRepeats * L);
      // The last (kRepeats - 1) L + 1 calls each equal the call a cycle before.
      for (size_t x = 0; x <= (kRepeats - 1) * L; ++x) CHECK(hist[i - x] == hist[i - x - L]);
      size_t uses = 0;  // and the buffer is used once in the cycle
      for (size_t x = 0; x < L; ++x) uses += hist[i - x].recv == k.recv;
      CHECK(uses == 1);
    }
    CHECK(policy.statefulBuffers() == stateful.size());
  }
  return 0;
}
