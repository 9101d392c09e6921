#include "nccl_shim/group.h"

#include "nccl_shim/comm_registry.h"

namespace lowrank::shim::group {
namespace {

struct ThreadGroup {
  int depth = 0;
  std::vector<RecordedCall> calls;
};

ThreadGroup& mine() {
  static thread_local ThreadGroup g;
  return g;
}

}  // namespace

int depth() { return mine().depth; }

void start() { ++mine().depth; }

bool end() {
  ThreadGroup& g = mine();
  if (g.depth > 0) --g.depth;  // an unmatched end is NCCL's error to report, not ours
  return g.depth == 0;
}

void record(RecordedCall call) { mine().calls.push_back(std::move(call)); }

std::vector<RecordedCall> takeRecorded() {
  std::vector<RecordedCall> out;
  out.swap(mine().calls);
  return out;
}

}  // namespace lowrank::shim::group
