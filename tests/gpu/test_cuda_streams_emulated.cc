// The device path's streams under the CPU emulation's dependency graph (tests/gpu/emu/trace.h),
// issue 26 item 1: a compressed call forks its own stream from the caller's and joins the caller's
// stream once, at the end, so that the caller's next kernel depends on lowrank's communication
// through that join only (DDP's backward goes on while factors travel). Emulation only: the graph
// is the emulation's (test_cuda_streams.cc has the stream tests that run on a GPU too).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"
#include "support/env.h"
#include "support/ranks.h"
#include "trace.h"

using namespace lowrank::testing;

namespace {

const std::vector<std::vector<size_t>> kShapes = {{96, 80}, {40}, {64, 3, 3, 5}};

// NCCL's collectives as the double names them (lowrank calls the pnccl entries).
bool isCommunication(const emu::TracedOp& op) { return op.what.find("ncclAllReduce") != std::string::npos; }

// The operations `from` depends on, directly or not; `cut`: an operation whose event wait is
// left out of the walk (its place in its stream's order stays).
std::set<uint64_t> ancestors(const std::map<uint64_t, const emu::TracedOp*>& ops, uint64_t from,
                             uint64_t cut = 0) {
  std::set<uint64_t> seen;
  std::vector<uint64_t> todo{from};
  while (!todo.empty()) {
    const uint64_t seq = todo.back();
    todo.pop_back();
    auto it = ops.find(seq);
    if (it == ops.end()) continue;  // queued before the trace began
    for (uint64_t d : it->second->deps) {
      // (An event recorded just before on the same stream is also the stream's order: kept.)
      if (seq == cut && d == it->second->eventDep && d != it->second->streamDep) continue;
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  return seen;
}

TEST(DeviceStreams, CallersNextKernelWaitsOnCommunicationOnlyThroughTheFinalJoin) {
  LR_SKIP_WITHOUT_DEVICE();
  // Several chunks: waits mid-call if any (read when the comm is made).
  std::optional<lowrank::testing::EnvGuard> chunk(std::in_place, "LOWRANK_PIPELINE_CHUNK", "2048");
  const size_t count = countOf(kShapes);
  lowrankConfig_t cfg = config(4);
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  void* g = toDevice(decayingInput(1, count, 0, 5), lowrankFloat32);
  setLayoutOf(one.comm, g, kShapes);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // Two calls first: the plan (and its check) is made, the next call is a warm-started one.
  for (int c = 0; c < 2; ++c)
    ASSERT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, s), lowrankSuccess)
        << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  emu::traceBegin();
  ASSERT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, s), lowrankSuccess)
      << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaMemsetAsync(g, 0, sizeof(float), s), cudaSuccess);  // the caller's next kernel
  const std::vector<emu::TracedOp> trace = emu::traceEnd();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  chunk.reset();

  std::map<uint64_t, const emu::TracedOp*> ops;
  for (const auto& op : trace) ops[op.seq] = &op;
  ASSERT_FALSE(trace.empty());
  const emu::TracedOp& next = trace.back();
  ASSERT_EQ(next.stream, s);
  std::vector<const emu::TracedOp*> onCaller;
  size_t communications = 0;
  for (const auto& op : trace) {
    if (op.stream == s && &op != &next) onCaller.push_back(&op);
    communications += isCommunication(op);
  }
  EXPECT_GE(communications, 2u) << "a compressed call allreduces P and Q";
  for (const auto* op : onCaller)
    EXPECT_NE(op->what, "kernel launch") << "the schedule's kernels run on lowrank's stream, not "
                                            "the caller's";
  ASSERT_FALSE(onCaller.empty());
  const emu::TracedOp& join = *onCaller.back();
  EXPECT_EQ(join.what, "cudaStreamWaitEvent") << "the call ends by joining the caller's stream";

  const std::set<uint64_t> all = ancestors(ops, next.seq);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](uint64_t a) {
    return ops.count(a) && isCommunication(*ops.at(a));
  })) << "the caller's next kernel must wait for the result";
  for (uint64_t a : ancestors(ops, next.seq, join.seq)) {
    if (ops.count(a)) {
      EXPECT_FALSE(isCommunication(*ops.at(a)))
          << "the caller's stream waits on '" << ops.at(a)->what << "' (op " << a
          << ") other than through the final join";
    }
  }
  cudaStreamDestroy(s);
  cudaFree(g);
}

}  // namespace
