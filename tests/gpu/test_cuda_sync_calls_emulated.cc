// No synchronizing CUDA call on the training path (issue 39, item 2): after a buffer's first
// compressed call, lowrank makes none of the calls that CUDA's runtime documents as synchronizing
// the host with the device or with other streams (the emulation counts them by kind and thread:
// tests/gpu/emu/sync_calls.h). A DDP-shaped run: six tensors in two buckets, one call per bucket
// per step on two non-blocking streams, from a worker thread (as the hook's), the buckets rebuilt
// into another grouping at step 10 (as DDP does after its first iteration: new buffers planned
// mid-training, the old ones released), a checkpoint saved at step 20 and restored at step 30;
// 100 calls. Everything the test itself does on the device (memory, uploads) is on the main thread
// before the run. And lowrank's set-up and waits on one thread leave another thread's CUDA graph
// capture in global mode (PyTorch's) intact (issue 39, item 3). Emulation only.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"
#include "lowrank/lowrank_nccl.h"
#include "support/env.h"
#include "support/ranks.h"
#include "sync_calls.h"

using namespace lowrank::testing;

namespace {

struct T {
  uint64_t id;
  size_t rows, cols;  // cols 1: a vector (exact)
  size_t numel() const { return rows * cols; }
};
using Group = std::vector<T>;
const std::vector<Group> kFirst = {{{1, 48, 40}, {2, 32, 30}, {3, 16, 1}},
                                   {{4, 40, 24}, {5, 24, 1}, {6, 64, 16}}};
const std::vector<Group> kRebuilt = {{{6, 64, 16}, {1, 48, 40}},
                                     {{2, 32, 30}, {3, 16, 1}, {5, 24, 1}, {4, 40, 24}}};
constexpr int kSteps = 50, kRebuildAt = 10, kSaveAt = 20, kRestoreAt = 30;

// One bucket: its gradient (uploaded once) and its output buffer, which carries the tensor ids.
struct Bucket {
  Group g;
  size_t count = 0;
  void* send = nullptr;
  void* recv = nullptr;
  explicit Bucket(Group group) : g(std::move(group)) {
    std::vector<float> x;
    for (const T& t : g) {
      const std::vector<float> v = t.cols > 1 ? decayingInput(t.rows, t.cols, 0, unsigned(t.id))
                                              : gaussian(t.numel(), unsigned(t.id), 0.1f);
      x.insert(x.end(), v.begin(), v.end());
    }
    count = x.size();
    send = toDevice(x, lowrankFloat32);
    recv = toDevice(x, lowrankFloat32);
  }
  ~Bucket() {
    cudaFree(send);
    cudaFree(recv);
  }
  lowrankResult_t declare(lowrankComm_t comm) const {
    std::vector<lowrankTensor_t> d;
    for (const T& t : g) {
      lowrankTensor_t x{};
      x.id = t.id;
      x.ndims = t.cols > 1 ? 2 : 1;
      x.shape[0] = t.rows;
      x.shape[1] = t.cols;
      x.approxRank = LOWRANK_RANK_DEFAULT;
      d.push_back(x);
    }
    return lowrankBufferSetTensors(comm, recv, int(d.size()), d.data());
  }
};

// The synchronizing calls `thread` made since the last reset, "kind: n" per line ("" for none).
std::string callsOf(std::thread::id thread) {
  std::ostringstream out;
  for (const auto& [key, n] : emu::syncCalls())
    if (key.second == thread) out << key.first << ": " << n << "\n";
  return out.str();
}

struct RunCounts {
  std::string firstStep, training;  // the worker's synchronizing calls: step 0, steps 1..
  uint64_t compressedCalls = 0;
  std::string error;
};

// The DDP-shaped run; the worker's calls counted apart for step 0 and the rest.
RunCounts ddpShapedRun() {
  RunCounts run;
  lowrankConfig_t cfg = config(4);
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  std::vector<Bucket*> first, rebuilt;
  for (const Group& g : kFirst) first.push_back(new Bucket(g));
  for (const Group& g : kRebuilt) rebuilt.push_back(new Bucket(g));
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (cudaDeviceSynchronize() != cudaSuccess) run.error = "set-up failed";

  std::thread worker([&] {
    auto fail = [&](const std::string& what) {
      if (run.error.empty()) run.error = what + ": " + lowrankGetLastError(one.comm);
    };
    std::vector<unsigned char> saved;
    for (int step = 0; step < kSteps && run.error.empty(); ++step) {
      if (step == 1) {
        run.firstStep = callsOf(std::this_thread::get_id());
        emu::syncCallsReset();
      }
      const std::vector<Bucket*>& buckets = step < kRebuildAt ? first : rebuilt;
      for (size_t b = 0; b < buckets.size(); ++b) {
        const Bucket& k = *buckets[b];
        if (k.declare(one.comm) != lowrankSuccess) fail("lowrankBufferSetTensors");
        if (step == kRestoreAt && b == 0 &&
            lowrankBufferRestoreState(one.comm, k.recv, saved.data(), saved.size()) != lowrankSuccess)
          fail("lowrankBufferRestoreState");
        if (lowrankAllReduce(k.send, k.recv, k.count, lowrankFloat32, lowrankAvg, one.comm,
                             streams[b % 2]) != lowrankSuccess)
          fail("lowrankAllReduce at step " + std::to_string(step));
        if (step == kSaveAt && b == 0) {  // a checkpoint of the first bucket's ids
          size_t size = 0;
          if (lowrankBufferSaveState(one.comm, k.recv, nullptr, &size) != lowrankSuccess)
            fail("lowrankBufferSaveState (size)");
          saved.resize(size);
          if (lowrankBufferSaveState(one.comm, k.recv, saved.data(), &size) != lowrankSuccess)
            fail("lowrankBufferSaveState");
        }
      }
    }
    run.training = callsOf(std::this_thread::get_id());
    lowrankStats_t st;
    lowrankGetStats(one.comm, &st);
    run.compressedCalls = st.compressedCalls;
  });
  worker.join();
  cudaDeviceSynchronize();
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  for (Bucket* b : first) delete b;
  for (Bucket* b : rebuilt) delete b;
  return run;
}

TEST(DeviceSyncCalls, NoneOnTheTrainingPathOfADdpShapedRun) {
  LR_SKIP_WITHOUT_DEVICE();
  const RunCounts run = ddpShapedRun();
  ASSERT_EQ(run.error, "");
  EXPECT_EQ(run.compressedCalls, uint64_t(2 * kSteps)) << "every call compressed";
  // The count sees the worker's calls: its first step makes the communicator's device side and
  // the first pinned slab (cudaMalloc, cudaMallocHost).
  EXPECT_NE(run.firstStep, "") << "no synchronizing call counted at the first step";
  EXPECT_EQ(run.training, "")
      << "synchronizing calls after the first step (rebucketing at step " << kRebuildAt
      << ", restore at step " << kRestoreAt << "):\n" << run.training;
}

// Where the device has no memory pools the rebucketed buffers allocate and the released ones free
// synchronously (the backend says so once, docs/cuda.md): the count shows it, so the test above
// would see such calls.
TEST(DeviceSyncCalls, WithoutMemoryPoolsTheRebucketingSynchronizes) {
  LR_SKIP_WITHOUT_DEVICE();
  const RunCounts run = [] {
    const lowrank::testing::EnvGuard noPools("LOWRANK_EMU_NO_MEMORY_POOLS", "1");
    return ddpShapedRun();
  }();
  ASSERT_EQ(run.error, "");
  EXPECT_NE(run.training.find("cudaMalloc: "), std::string::npos) << run.training;
  EXPECT_NE(run.training.find("cudaFree: "), std::string::npos) << run.training;
}

// The emulation's model of capture modes, which the next test relies on: a potentially unsafe
// call (cudaMalloc) from another thread breaks a capture in global mode, unless that thread is in
// relaxed mode.
cudaError_t captureWhileAnotherThreadMallocs(cudaStreamCaptureMode otherThreadsMode) {
  cudaStream_t x = nullptr;
  EXPECT_EQ(cudaStreamCreate(&x), cudaSuccess);
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(x, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(d, 1, 64, x), cudaSuccess);
  void* p = nullptr;
  std::thread other([&] {
    cudaStreamCaptureMode mode = otherThreadsMode;
    EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    if (cudaMalloc(&p, 64) != cudaSuccess) p = nullptr;
    EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  });
  other.join();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(x, &graph);
  if (p) cudaFree(p);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  cudaDeviceSynchronize();
  cudaFree(d);
  cudaStreamDestroy(x);
  return ended;
}

TEST(DeviceCapture, EmulationBreaksAGlobalCaptureOnAnotherThreadsUnsafeCall) {
  LR_SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(captureWhileAnotherThreadMallocs(cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(captureWhileAnotherThreadMallocs(cudaStreamCaptureModeRelaxed), cudaSuccess);
}

// A thread captures a graph on a blocking stream in global mode (PyTorch's default) while another
// makes a communicator's first device calls (the backend's device side, a buffer planned and
// checked across comm ranks, pinned memory), later calls, a checkpoint save and the stats: the
// capture ends cleanly and its graph runs.
TEST(DeviceCapture, PlanningOnAnotherThreadLeavesAGlobalCaptureIntact) {
  LR_SKIP_WITHOUT_DEVICE();
  lowrankConfig_t cfg = config(4);
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  Bucket bucket(kFirst[0]);
  cudaStream_t x = nullptr, s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&x), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 256), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 256), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(x, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 7, 256, x), cudaSuccess);
  std::string error;
  std::thread hook([&] {
    auto fail = [&](const char* what) {
      if (error.empty()) error = std::string(what) + ": " + lowrankGetLastError(one.comm);
    };
    if (bucket.declare(one.comm) != lowrankSuccess) fail("lowrankBufferSetTensors");
    for (int call = 0; call < 3; ++call)
      if (lowrankAllReduce(bucket.send, bucket.recv, bucket.count, lowrankFloat32, lowrankAvg,
                           one.comm, s) != lowrankSuccess)
        fail("lowrankAllReduce");
    size_t size = 0;
    if (lowrankBufferSaveState(one.comm, bucket.recv, nullptr, &size) != lowrankSuccess)
      fail("lowrankBufferSaveState (size)");
    std::vector<unsigned char> saved(size);
    if (lowrankBufferSaveState(one.comm, bucket.recv, saved.data(), &size) != lowrankSuccess)
      fail("lowrankBufferSaveState");
    lowrankStats_t st;
    if (lowrankGetStats(one.comm, &st) != lowrankSuccess || st.compressedCalls != 3)
      fail("lowrankGetStats (3 compressed calls)");
  });
  hook.join();
  EXPECT_EQ(error, "");
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(x, &graph), cudaSuccess)
      << "lowrank's calls on another thread broke the capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, x), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(x), cudaSuccess);
  unsigned char host[256];
  ASSERT_EQ(cudaMemcpy(host, d, 256, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 7);
  EXPECT_EQ(host[255], 7);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(x);
  cudaStreamDestroy(s);
}

}  // namespace
