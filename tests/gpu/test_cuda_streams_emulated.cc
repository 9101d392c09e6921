// The device path's streams under the CPU emulation's dependency graph (tests/gpu/emu/trace.h),
// issue 26 items 1 and 4: a compressed call forks its own stream from the caller's and joins the
// caller's stream once, at the end, so that the caller's next kernel depends on lowrank's
// communication through that join only (DDP's backward goes on while factors travel); and calls
// queued on two non-blocking streams with no host synchronization, a restore among them, give the
// serialized run's outputs bit for bit (set-up, restore and plan words are stream-ordered, never a
// pageable copy racing a non-blocking stream). Emulation only: the graph is the emulation's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"
#include "support/ranks.h"
#include "trace.h"

using namespace lowrank::testing;

namespace {

const std::vector<std::vector<size_t>> kShapes = {{96, 80}, {40}, {64, 3, 3, 5}};
const std::vector<std::vector<size_t>> kSmallShapes = {{40, 24}, {16}, {24, 2, 2, 3}};  // 200 calls

size_t countOf(const std::vector<std::vector<size_t>>& shapes) {
  size_t count = 0;
  for (const auto& s : shapes) {
    size_t n = 1;
    for (size_t d : s) n *= d;
    count += n;
  }
  return count;
}

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
      if (seq == cut && d == it->second->eventDep) continue;
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  return seen;
}

TEST(DeviceStreams, CallersNextKernelWaitsOnCommunicationOnlyThroughTheFinalJoin) {
  LR_SKIP_WITHOUT_DEVICE();
  setenv("LOWRANK_PIPELINE_CHUNK", "2048", 1);  // several chunks: waits mid-call if any
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
  unsetenv("LOWRANK_PIPELINE_CHUNK");

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

// 200 in-place calls on one buffer: input copied up, the call, output copied down, each on the
// caller's stream; `alternate`: on two non-blocking streams in turn, chained by events, with no
// host synchronization; else on one stream, synchronized after every call. The state is saved
// after call 49 and restored before call 100 on both.
std::vector<float> run200(bool alternate) {
  constexpr int kCalls = 200, kSaveAfter = 49, kRestoreAt = 100;
  const size_t count = countOf(kSmallShapes);
  lowrankConfig_t cfg = config(4);
  cfg.seed = 3;
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  float *inputs = nullptr, *outputs = nullptr;  // pinned: copies that never wait for the host
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&inputs), kCalls * count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&outputs), kCalls * count * sizeof(float)), cudaSuccess);
  for (int c = 0; c < kCalls; ++c) {
    const std::vector<float> x = decayingInput(1, count, 0, 300 + c % 50);  // 100 as 50
    std::memcpy(inputs + c * count, x.data(), count * sizeof(float));
  }
  void* g = nullptr;
  EXPECT_EQ(cudaMalloc(&g, count * sizeof(float)), cudaSuccess);
  setLayoutOf(one.comm, g, kSmallShapes);
  cudaStream_t st[2];
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), cudaSuccess);
  }
  std::vector<char> saved;
  for (int c = 0; c < kCalls; ++c) {
    const int i = alternate ? c % 2 : 0;
    if (alternate && c > 0) {
      EXPECT_EQ(cudaStreamWaitEvent(st[i], ev[1 - i], 0), cudaSuccess);
    }
    if (c == kRestoreAt) {
      EXPECT_EQ(lowrankBufferRestoreState(one.comm, g, saved.data(), saved.size()), lowrankSuccess)
          << lowrankGetLastError(one.comm);
    }
    EXPECT_EQ(cudaMemcpyAsync(g, inputs + c * count, count * sizeof(float), cudaMemcpyHostToDevice,
                              st[i]), cudaSuccess);
    EXPECT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, st[i]),
              lowrankSuccess) << "call " << c << ": " << lowrankGetLastError(one.comm);
    EXPECT_EQ(cudaMemcpyAsync(outputs + c * count, g, count * sizeof(float), cudaMemcpyDeviceToHost,
                              st[i]), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(ev[i], st[i]), cudaSuccess);
    if (!alternate) {
      EXPECT_EQ(cudaStreamSynchronize(st[i]), cudaSuccess);
    }
    if (c == kSaveAfter) {  // the save itself waits for the state's last call (bounded)
      size_t size = 0;
      EXPECT_EQ(lowrankBufferSaveState(one.comm, g, nullptr, &size), lowrankSuccess);
      saved.resize(size);
      EXPECT_EQ(lowrankBufferSaveState(one.comm, g, saved.data(), &size), lowrankSuccess)
          << lowrankGetLastError(one.comm);
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  lowrankStats_t stats;
  EXPECT_EQ(lowrankGetStats(one.comm, &stats), lowrankSuccess);
  EXPECT_EQ(stats.compressedCalls, uint64_t(kCalls)) << "every call compressed (startIter 0)";
  std::vector<float> out(outputs, outputs + kCalls * count);
  for (int i = 0; i < 2; ++i) {
    cudaStreamDestroy(st[i]);
    cudaEventDestroy(ev[i]);
  }
  cudaFree(g);
  cudaFreeHost(inputs);
  cudaFreeHost(outputs);
  return out;
}

TEST(DeviceStreams, TwoHundredCallsOnTwoNonBlockingStreamsAreTheSerializedRunBitForBit) {
  LR_SKIP_WITHOUT_DEVICE();
  const std::vector<float> serialized = run200(false), alternating = run200(true);
  ASSERT_EQ(serialized.size(), alternating.size());
  const size_t count = countOf(kSmallShapes);
  for (size_t i = 0; i < serialized.size(); ++i)
    if (std::memcmp(&serialized[i], &alternating[i], sizeof(float)) != 0)
      FAIL() << "call " << i / count << ", element " << i % count << ": " << alternating[i]
             << " on two streams, " << serialized[i] << " serialized";
  // The restore took effect: calls 100 to 149 start from the state saved after call 49 and see
  // the inputs of calls 50 to 99, so they repeat those outputs bit for bit.
  for (size_t i = 50 * count; i < 100 * count; ++i)
    ASSERT_EQ(std::memcmp(&alternating[i], &alternating[i + 50 * count], sizeof(float)), 0)
        << "call " << i / count + 50 << " does not repeat call " << i / count;
}

}  // namespace
