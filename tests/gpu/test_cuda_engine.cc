// The CUDA backend through the C API on one GPU, one comm rank over NCCL: the device engine agrees
// with the host engine call after call (error feedback, warm start, pipelining, dtypes, layouts),
// is exact on rank-k input, handles non-finite input without poisoning its state, passes
// ineligible calls to NCCL unchanged, and refuses graph capture. Skips without a device. Built
// against the CPU emulation of CUDA (tests/gpu/emu), the same tests run in CI with the NCCL test
// double; each says which engine ran (expectDeviceEngineRan) and the log says on what device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"
#include "support/env.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

// The log says where the tests ran: a GPU, or the CPU emulation.
class WhereTheyRun : public ::testing::Environment {
 public:
  void SetUp() override { printf("device engine tests on: %s\n", deviceName().c_str()); }
};
const auto* const whereTheyRun = ::testing::AddGlobalTestEnvironment(new WhereTheyRun);

// (dtype, per-tensor layout, pipelined, approximation rank, error feedback)
using Case = std::tuple<lowrankDataType_t, bool, bool, int, bool>;

class DeviceVsHost : public ::testing::TestWithParam<Case> {};

// Three tensors (two compressed, one bias) in one bucket, or one batched matrix.
const std::vector<std::vector<size_t>> kShapes = {{96, 200}, {300}, {128, 3, 3, 17}};

void setLayout(lowrankComm_t comm, const void* buf) { setLayoutOf(comm, buf, kShapes); }

TEST_P(DeviceVsHost, AgreeCallAfterCall) {
  LR_SKIP_WITHOUT_DEVICE();
  const auto [dtype, perTensor, pipelined, k, ef] = GetParam();
  size_t count = 0;
  for (const auto& s : kShapes) {
    size_t n = 1;
    for (size_t d : s) n *= d;
    count += n;
  }
  // Several chunks per phase when pipelined (both engines read the same variable).
  const lowrank::testing::EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", "4096");
  lowrankConfig_t cfg = config(k);
  cfg.pipeline = pipelined;
  cfg.errorFeedback = ef;
  cfg.seed = 11;

  const int calls = 4;
  std::vector<std::vector<float>> inputs, hostOut(calls);
  for (int c = 0; c < calls; ++c) inputs.push_back(decayingInput(1, count, 0, 100 + c));
  // The host engine, one comm rank: the reference, rounded to dtype as the device input is.
  withComms(1, [&](int, lowrankComm_t comm) {
    std::vector<char> raw(count * dtypeBytes(dtype)), out(raw.size());
    if (perTensor) setLayout(comm, out.data());
    for (int c = 0; c < calls; ++c) {
      lowrank::host::fromFloat32(inputs[c].data(), count, 1.f, raw.data(), dtype);
      ASSERT_EQ(lowrankAllReduce(raw.data(), out.data(), count, dtype, lowrankAvg, comm, nullptr),
                lowrankSuccess);
      hostOut[c].resize(count);
      lowrank::host::toFloat32(out.data(), dtype, count, hostOut[c].data());
    }
  }, cfg);

  OneRankNccl one(cfg);
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, count * dtypeBytes(dtype)), cudaSuccess);
  if (perTensor) setLayout(one.comm, out);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const double tol = dtype == lowrankFloat32 ? 1e-4 : 1e-2;
  for (int c = 0; c < calls; ++c) {
    void* g = toDevice(inputs[c], dtype);
    ASSERT_EQ(lowrankAllReduce(g, out, count, dtype, lowrankAvg, one.comm, s), lowrankSuccess)
        << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<float> dev = fromDevice(out, count, dtype);
    EXPECT_LT(relErr(dev, hostOut[c]), tol) << "call " << c;
    cudaFree(g);
  }
  expectDeviceEngineRan(one.comm, out, calls);
  lowrankBufferView_t view;
  ASSERT_EQ(lowrankBufferGetView(one.comm, out, &view), lowrankSuccess);
  EXPECT_EQ(view.perTensor, int(perTensor));
  EXPECT_EQ(view.calls, size_t(calls));
  if (pipelined) {
    EXPECT_GT(view.chunks, 1u) << "several chunks per phase";
  }
  cudaStreamDestroy(s);
  cudaFree(out);
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, DeviceVsHost,
    ::testing::Values(Case{lowrankFloat32, false, false, 4, true}, Case{lowrankFloat32, true, false, 4, true},
                      Case{lowrankFloat32, true, true, 4, true}, Case{lowrankFloat32, false, true, 1, true},
                      Case{lowrankFloat32, true, true, 2, false}, Case{lowrankFloat32, true, true, 8, true},
                      Case{lowrankFloat32, false, false, 40, true}, Case{lowrankBfloat16, true, true, 4, true},
                      Case{lowrankFloat16, false, true, 4, true}));

// Rank-k input on one comm rank: P Q^T reproduces it (the sum over ranks is the input itself).
TEST(DeviceEngine, ExactOnRankKInput) {
  LR_SKIP_WITHOUT_DEVICE();
  const size_t n = 300, m = 500;
  for (int k : {1, 4, 8}) {
    const std::vector<float> x = rankKInput(n, m, k, 0);
    OneRankNccl one(config(k));
    size_t shape[2] = {n, m};
    const size_t* shapes[1] = {shape};
    int nd = 2;
    void* g = toDevice(x, lowrankFloat32);
    ASSERT_EQ(lowrankBufferSetLayout(one.comm, g, 1, &nd, shapes), lowrankSuccess);
    for (lowrankRedOp_t op : {lowrankSum, lowrankAvg}) {
      ASSERT_EQ(lowrankAllReduce(g, g, n * m, lowrankFloat32, op, one.comm, nullptr), lowrankSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_LT(relErr(fromDevice(g, n * m, lowrankFloat32), x), 1e-4) << "k " << k;
    }
    expectDeviceEngineRan(one.comm, g, 2);
    cudaFree(g);
  }
}

// A NaN makes that call's output NaN; the state is not poisoned: the next call is finite again
// and the rejected call is counted.
TEST(DeviceEngine, NonFiniteInputIsRejectedWithoutPoisoningState) {
  LR_SKIP_WITHOUT_DEVICE();
  const size_t n = 64, m = 128, count = n * m;
  OneRankNccl one(config(4));
  std::vector<float> x = rankKInput(n, m, 4, 0), bad = x;
  bad[17] = NAN;
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, count * 4), cudaSuccess);
  void* g = toDevice(x, lowrankFloat32);
  void* b = toDevice(bad, lowrankFloat32);
  ASSERT_EQ(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess);
  ASSERT_EQ(lowrankAllReduce(b, out, count, lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> r = fromDevice(out, count, lowrankFloat32);
  EXPECT_TRUE(std::isnan(r[17]));
  ASSERT_EQ(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  r = fromDevice(out, count, lowrankFloat32);
  for (float v : r) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(relErr(r, x), 1e-4);
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.fallbackCalls, 1u);
  expectDeviceEngineRan(one.comm, out, 3);
  cudaFree(g);
  cudaFree(b);
  cudaFree(out);
}

// Rejected calls queued back to back on one buffer, with no synchronize between them, are each
// counted once the device has run them: every call's checks need their own host slot (one shared
// slot lost a rejection followed by another call before its checks were collected). More calls
// than the engine keeps slots for, and a release with a rejection still in flight, count too.
TEST(DeviceEngine, RejectionsQueuedBackToBackAreAllCounted) {
  LR_SKIP_WITHOUT_DEVICE();
  const size_t n = 64, m = 128, count = n * m;
  OneRankNccl one(config(4));
  std::vector<float> x = rankKInput(n, m, 4, 0), bad = x;
  bad[17] = NAN;
  bad[count - 1] = INFINITY;
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, count * 4), cudaSuccess);
  void* g = toDevice(x, lowrankFloat32);
  void* b = toDevice(bad, lowrankFloat32);
  auto call = [&](void* in) {
    ASSERT_EQ(lowrankAllReduce(in, out, count, lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess)
        << lowrankGetLastError(one.comm);
  };
  auto fallbacks = [&] {
    lowrankStats_t st;
    EXPECT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
    return st.fallbackCalls;
  };
  auto expectGoodOutput = [&](const char* when) {
    const std::vector<float> r = fromDevice(out, count, lowrankFloat32);
    for (float v : r) ASSERT_TRUE(std::isfinite(v)) << when;
    EXPECT_LT(relErr(r, x), 1e-4) << when;
  };
  call(g);  // plans the buffer (the host waits there) and warms it up
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(fallbacks(), 0u);

  call(b);
  call(g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(fallbacks(), 1u) << "bad then good: the bad call is counted";
  expectGoodOutput("the good call after a rejected one");

  call(b);
  call(b);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(fallbacks(), 3u) << "two bad calls in a row count two";
  EXPECT_TRUE(std::isnan(fromDevice(out, count, lowrankFloat32)[0]));

  const int many = 9;  // more than the engine's slots per buffer: the oldest are collected first
  for (int i = 0; i < many; ++i) call(b);
  call(g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(fallbacks(), 3u + many);
  expectGoodOutput("the good call after many rejected ones");

  call(b);
  call(g);
  call(b);
  ASSERT_EQ(lowrankBufferReset(one.comm, out), lowrankSuccess);
  EXPECT_EQ(fallbacks(), 5u + many) << "reset collects the checks still in flight";
  call(g);  // re-plans
  call(b);
  ASSERT_EQ(lowrankBufferRelease(one.comm, out), lowrankSuccess);
  EXPECT_EQ(fallbacks(), 6u + many) << "release collects the checks still in flight";
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.stateBytes, 0u);
  EXPECT_EQ(st.buffers, 0u);
  EXPECT_EQ(st.compressedCalls, 3u + 2u + many + 1u + 3u + 2u);
  cudaFree(g);
  cudaFree(b);
  cudaFree(out);
}

// Calls that are not compressed (int32, max, k = 0) are NCCL's allreduce as is: bit-exact.
TEST(DeviceEngine, IneligibleCallsAreNcclsOwn) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config(4));
  const size_t count = 4096;
  std::vector<int> xi(count);
  for (size_t i = 0; i < count; ++i) xi[i] = int(i * 7919 % 1000) - 500;
  int* di = nullptr;
  ASSERT_EQ(cudaMalloc(&di, count * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(di, xi.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(lowrankAllReduce(di, di, count, lowrankInt32, lowrankSum, one.comm, nullptr), lowrankSuccess);
  std::vector<int> ri(count);
  ASSERT_EQ(cudaMemcpy(ri.data(), di, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(ri, xi);
  const std::vector<float> xf = decayingInput(64, 64, 0);
  void* df = toDevice(xf, lowrankFloat32);
  ASSERT_EQ(lowrankAllReduce(df, df, xf.size(), lowrankFloat32, lowrankMax, one.comm, nullptr), lowrankSuccess);
  EXPECT_EQ(fromDevice(df, xf.size(), lowrankFloat32), xf);
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.compressedCalls, 0u);
  EXPECT_EQ(st.calls, 2u);
  EXPECT_EQ(st.exactElements, count + xf.size()) << "both calls went to NCCL through the device engine";
  cudaFree(di);
  cudaFree(df);
}

TEST(DeviceEngine, GraphCaptureIsRefused) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config(4));
  const std::vector<float> x = decayingInput(64, 64, 0);
  void* g = toDevice(x, lowrankFloat32);
  // Allocated and filled before the capture: cudaMalloc and a synchronous copy during it would
  // invalidate it (they are unsafe in thread-local capture mode).
  const std::vector<float> ones(x.size(), 1.f);
  void* h = toDevice(ones, lowrankFloat32);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(lowrankAllReduce(g, g, x.size(), lowrankFloat32, lowrankSum, one.comm, s), lowrankInvalidUsage);
  EXPECT_NE(std::string(lowrankGetLastError(one.comm)).find("CUDA graph"), std::string::npos);
  // An uncompressed call is NCCL's own and is captured; the graph replays it.
  EXPECT_EQ(lowrankAllReduce(h, h, x.size(), lowrankFloat32, lowrankMax, one.comm, s), lowrankSuccess)
      << lowrankGetLastError(one.comm);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the refusal must not break the capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(fromDevice(h, x.size(), lowrankFloat32), ones);
  // The communicator is still usable outside the graph, and compresses.
  EXPECT_EQ(lowrankAllReduce(g, g, x.size(), lowrankFloat32, lowrankSum, one.comm, s), lowrankSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  expectDeviceEngineRan(one.comm, g, 1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cudaFree(g);
  cudaFree(h);
}

// Release frees the device state; a changed count re-plans (the view follows).
TEST(DeviceEngine, ReleaseFreesStateAndCountChangeReplans) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config(4));
  const std::vector<float> x = decayingInput(128, 128, 0);
  void* g = toDevice(x, lowrankFloat32);
  ASSERT_EQ(lowrankAllReduce(g, g, x.size(), lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess)
      << lowrankGetLastError(one.comm);
  lowrankBufferView_t view;
  ASSERT_EQ(lowrankBufferGetView(one.comm, g, &view), lowrankSuccess);
  EXPECT_EQ(view.planned, 1);
  EXPECT_EQ(view.calls, 1u);
  EXPECT_EQ(size_t(view.rows) * view.cols, x.size()) << "128 x 128 viewed as one matrix";
  ASSERT_EQ(lowrankAllReduce(g, g, x.size() / 2, lowrankFloat32, lowrankSum, one.comm, nullptr), lowrankSuccess)
      << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  expectDeviceEngineRan(one.comm, g, 2);
  EXPECT_EQ(st.buffers, 1u);
  EXPECT_GT(st.stateBytes, x.size() / 2 * 4) << "the residual of the re-planned buffer";
  EXPECT_LT(st.stateBytes, x.size() * 4) << "the first plan's residual was freed";
  ASSERT_EQ(lowrankBufferRelease(one.comm, g), lowrankSuccess);
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.stateBytes, 0u);
  EXPECT_EQ(st.buffers, 0u);
  cudaFree(g);
}

// Mixed host and device buffers are refused before anything runs.
TEST(DeviceEngine, MixedHostAndDeviceBuffersAreRefused) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config(4));
  std::vector<float> h(1024, 1.f);
  void* d = toDevice(h, lowrankFloat32);
  EXPECT_EQ(lowrankAllReduce(h.data(), d, h.size(), lowrankFloat32, lowrankSum, one.comm, nullptr),
            lowrankInvalidArgument);
  cudaFree(d);
}

// A nonblocking NCCL communicator: the double's NCCL_DOUBLE_INPROGRESS=N makes every collective
// return ncclInProgress and the next N polls of ncclCommGetAsyncError say so too. The device path's
// NCCL calls (plan check, factor allreduces, exact calls) wait it out: the outputs are those of a
// blocking communicator, bit for bit. One that never finishes fails the call with lowrankTimeout
// naming it, within the communicator's timeout. Emulated in its name: it needs the NCCL test double,
// so run_device_checks.sh leaves it out on a GPU (gtest filter -*Emulat*).
TEST(DeviceEngineEmulated, NonblockingNcclCommunicatorIsWaitedOut) {
  LR_SKIP_WITHOUT_DEVICE();
  if (!dlsym(RTLD_DEFAULT, "ncclDoubleLiveComms"))
    GTEST_SKIP() << "needs the NCCL test double (NCCL_DOUBLE_INPROGRESS), not a real NCCL";
  const size_t n = 96, m = 128;
  const std::vector<float> x = rankKInput(n, m, 4, 0);
  // Three compressed calls and an exact one (int32) on a comm made with `polls` set.
  auto run = [&](const char* polls, double timeoutSec, std::string* error) {
    std::optional<lowrank::testing::EnvGuard> inProgress;
    if (polls) inProgress.emplace("NCCL_DOUBLE_INPROGRESS", polls);
    lowrankConfig_t cfg = config(4);
    cfg.timeoutSec = timeoutSec;
    OneRankNccl one(cfg);  // the double reads the variable at ncclCommInitAll
    inProgress.reset();
    void* g = toDevice(x, lowrankFloat32);
    void* ints = nullptr;
    EXPECT_EQ(cudaMalloc(&ints, 64 * sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ints, 0, 64 * sizeof(int)), cudaSuccess);
    lowrankResult_t r = lowrankSuccess;
    for (int call = 0; call < 3 && r == lowrankSuccess; ++call)
      r = lowrankAllReduce(g, g, n * m, lowrankFloat32, lowrankAvg, one.comm, nullptr);
    if (r == lowrankSuccess) r = lowrankAllReduce(ints, ints, 64, lowrankInt32, lowrankSum, one.comm, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (r != lowrankSuccess) *error = lowrankGetErrorString(r) + std::string(": ") + lowrankGetLastError(one.comm);
    else expectDeviceEngineRan(one.comm, g, 3);
    std::vector<float> out = fromDevice(g, n * m, lowrankFloat32);
    cudaFree(g);
    cudaFree(ints);
    return out;
  };
  std::string error;
  const std::vector<float> blocking = run(nullptr, 30, &error);
  ASSERT_EQ(error, "");
  const std::vector<float> nonblocking = run("3", 30, &error);
  ASSERT_EQ(error, "") << "ncclInProgress was taken for a failure";
  EXPECT_EQ(std::memcmp(blocking.data(), nonblocking.data(), blocking.size() * 4), 0);

  const auto start = std::chrono::steady_clock::now();
  run("1000000000000", 1, &error);  // never done
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find(lowrankGetErrorString(lowrankTimeout)), std::string::npos) << error;
  EXPECT_NE(error.find("ncclAllReduce (plan check)"), std::string::npos) << error;
  EXPECT_NE(error.find("ncclInProgress"), std::string::npos) << error;
  EXPECT_LT(took, 1 + 5) << "bounded by the timeout, not hanging";
}

}  // namespace
