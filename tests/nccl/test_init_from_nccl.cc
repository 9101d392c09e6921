// lowrankCommInitFromNccl over the NCCL test double, comm ranks as threads: the same results as
// over UCX bit for bit, statistics, argument and environment errors, the NCCL communicator left
// alone by destroy and abort, and an NCCL error in the middle of a compressed call failing the
// communicator. Public C API only (liblowrank.so and the double's libnccl.so.2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "lowrank/lowrank_nccl.h"
#include "nccl_double.h"
#include "nccl_ranks.h"
#include "scenario.h"

namespace {

using ncclranks::withNcclComms;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Sets an environment variable for the scope (the comm ranks' threads read it at init).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

TEST(InitFromNccl, NullArgumentsAreRefused) {
  withNcclComms(1, [&](int, ncclComm_t nccl) {
    lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
    EXPECT_EQ(lowrankCommInitFromNccl(nullptr, nccl), lowrankInvalidArgument);
    EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "comm is NULL")) << lowrankGetLastError(nullptr);
    EXPECT_EQ(lowrankCommInitFromNccl(&comm, nullptr), lowrankInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "NCCL communicator is NULL"))
        << lowrankGetLastError(nullptr);
    lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
    EXPECT_EQ(lowrankCommInitFromNcclConfig(nullptr, nccl, &cfg), lowrankInvalidArgument);
  });
}

TEST(InitFromNccl, BadConfigIsRefused) {
  withNcclComms(1, [&](int, ncclComm_t nccl) {
    lowrankComm_t comm = nullptr;
    lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
    cfg.magic = 0;
    EXPECT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankInvalidArgument);
    EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "LOWRANK_CONFIG_INITIALIZER"));
    cfg = LOWRANK_CONFIG_INITIALIZER;
    cfg.approxRank = -3;
    EXPECT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankInvalidArgument);
    EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "approxRank")) << lowrankGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
  });
}

TEST(InitFromNccl, BadEnvironmentNamesTheVariable) {
  // Set after the NCCL communicator exists: the double reads LOWRANK_* too.
  withNcclComms(1, [&](int, ncclComm_t nccl) {
    lowrankComm_t comm = nullptr;
    {
      ScopedEnv env("LOWRANK_APPROX_RANK", "four");
      EXPECT_EQ(lowrankCommInitFromNccl(&comm, nccl), lowrankInvalidUsage);
      EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "LOWRANK_APPROX_RANK=\"four\""))
          << lowrankGetLastError(nullptr);
    }
    {
      ScopedEnv env("LOWRANK_TIMEOUT", "-1");
      EXPECT_EQ(lowrankCommInitFromNccl(&comm, nccl), lowrankInvalidUsage);
      EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "LOWRANK_TIMEOUT")) << lowrankGetLastError(nullptr);
    }
    EXPECT_EQ(comm, nullptr);
    // An explicit field wins over a good variable.
    ScopedEnv env("LOWRANK_APPROX_RANK", "3");
    lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
    cfg.seed = 9;
    ASSERT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess) << lowrankGetLastError(nullptr);
    lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
    ASSERT_EQ(lowrankCommGetConfig(comm, &got), lowrankSuccess);
    EXPECT_EQ(got.approxRank, 3);
    EXPECT_EQ(got.seed, 9);
    EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
  });
}

TEST(InitFromNccl, RankAndSizeAreTheNcclComms) {
  const int n = 3;
  withNcclComms(n, [&](int rank, ncclComm_t nccl) {
    lowrankComm_t comm = nullptr;
    ASSERT_EQ(lowrankCommInitFromNccl(&comm, nccl), lowrankSuccess) << lowrankGetLastError(nullptr);
    int v = -1;
    ASSERT_EQ(lowrankCommUserRank(comm, &v), lowrankSuccess);
    EXPECT_EQ(v, rank);
    ASSERT_EQ(lowrankCommCount(comm, &v), lowrankSuccess);
    EXPECT_EQ(v, n);
    EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
  });
}

// (a) The reductions are the same code, so the outputs over NCCL equal those over UCX bit for bit.
class BitIdentical : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(BitIdentical, ToUcxWithTheSameConfig) {
  const auto [n, pipeline] = GetParam();
  ScopedEnv chunk("LOWRANK_PIPELINE_CHUNK", "4096");  // several chunks for the pipelined schedule
  lowrankUniqueId ucxId;
  ASSERT_EQ(lowrankGetUniqueId(&ucxId), lowrankSuccess);
  withNcclComms(n, [&](int rank, ncclComm_t nccl) {
    lowrankConfig_t cfg = ncclscenario::config(pipeline);
    lowrankComm_t overNccl = nullptr, overUcx = nullptr;
    ASSERT_EQ(lowrankCommInitFromNcclConfig(&overNccl, nccl, &cfg), lowrankSuccess) << lowrankGetLastError(nullptr);
    ASSERT_EQ(lowrankCommInitRankConfig(&overUcx, n, ucxId, rank, &cfg), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    std::string outNccl, outUcx, err;
    ASSERT_EQ(ncclscenario::run(overUcx, rank, &outUcx, &err), lowrankSuccess) << err;
    ASSERT_EQ(ncclscenario::run(overNccl, rank, &outNccl, &err), lowrankSuccess) << err;
    EXPECT_EQ(outNccl.size(), outUcx.size());
    EXPECT_TRUE(outNccl == outUcx) << "comm rank " << rank << ": outputs over NCCL differ from UCX";
    lowrankStats_t sn, su;
    ASSERT_EQ(lowrankGetStats(overNccl, &sn), lowrankSuccess);
    ASSERT_EQ(lowrankGetStats(overUcx, &su), lowrankSuccess);
    EXPECT_GT(sn.compressedCalls, 0u);
    EXPECT_EQ(sn.compressedCalls, su.compressedCalls);
    EXPECT_EQ(sn.payloadElements, su.payloadElements);
    if (pipeline) {
      lowrankBufferView_t view;
      // The last buffer of the scenario is the large batched one, in place: its recvbuff is gone,
      // so check the plan through a fresh call of the same shape instead.
      std::vector<float> big(24000, 1.f);
      ASSERT_EQ(lowrankAllReduce(big.data(), big.data(), big.size(), lowrankFloat32, lowrankAvg,
                                 overNccl, nullptr), lowrankSuccess);
      ASSERT_EQ(lowrankBufferGetView(overNccl, big.data(), &view), lowrankSuccess);
      EXPECT_GT(view.chunks, 1u) << "the pipelined run should have had several chunks";
    }
    EXPECT_EQ(lowrankCommDestroy(overNccl), lowrankSuccess);
    EXPECT_EQ(lowrankCommDestroy(overUcx), lowrankSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(CommRanksAndPipeline, BitIdentical,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1)));

// (b) + (e): statistics count compressed calls and the ring's bytes, and every factor allreduce is
// a pncclAllReduce (never the interposable ncclAllReduce).
TEST(InitFromNccl, StatsAndCallsGoThroughPncclAllReduce) {
  const int n = 3;
  const unsigned long long plain0 = ncclDoubleCallCount("ncclAllReduce");
  const unsigned long long p0 = ncclDoubleCallCount("pncclAllReduce");
  withNcclComms(n, [&](int rank, ncclComm_t nccl) {
    lowrankConfig_t cfg = ncclscenario::config(1);
    lowrankComm_t comm = nullptr;
    ASSERT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess) << lowrankGetLastError(nullptr);
    std::string out, err;
    ASSERT_EQ(ncclscenario::run(comm, rank, &out, &err), lowrankSuccess) << err;
    lowrankStats_t before, after;
    ASSERT_EQ(lowrankGetStats(comm, &before), lowrankSuccess);
    EXPECT_EQ(before.calls, ncclscenario::specs().size() * ncclscenario::kSteps);
    EXPECT_GT(before.compressedCalls, 0u);
    EXPECT_GT(before.ratio, 1.0);
    // An exact call (int32) is one NCCL allreduce: the ring sends 2 (N-1)/N of it.
    std::vector<int32_t> x(3000, rank);
    ASSERT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankInt32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    EXPECT_EQ(x[2999], 0 + 1 + 2);
    ASSERT_EQ(lowrankGetStats(comm, &after), lowrankSuccess);
    EXPECT_EQ(after.compressedCalls, before.compressedCalls);
    EXPECT_EQ(after.elementsSent - before.elementsSent, 2u * (n - 1) * 3000 / n);
    EXPECT_EQ(after.bytesSent - before.bytesSent, 4u * 2u * (n - 1) * 3000 / n);
    EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
  });
  EXPECT_EQ(ncclDoubleCallCount("ncclAllReduce"), plain0) << "lowrank called the interposable name";
  // Every comm rank: at least P and Q per compressed call, plus the exact int32 call.
  EXPECT_GT(ncclDoubleCallCount("pncclAllReduce") - p0, 3u * 2u);
}

TEST(InitFromNccl, DestroyAndAbortLeaveTheNcclCommUsable) {
  const int n = 2;
  withNcclComms(n, [&](int rank, ncclComm_t nccl) {
    for (int abort = 0; abort < 2; ++abort) {
      lowrankComm_t comm = nullptr;
      ASSERT_EQ(lowrankCommInitFromNccl(&comm, nccl), lowrankSuccess) << lowrankGetLastError(nullptr);
      std::vector<float> g(4096, float(rank + 1));
      ASSERT_EQ(lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      EXPECT_EQ(abort ? lowrankCommAbort(comm) : lowrankCommDestroy(comm), lowrankSuccess);
      int x = rank + 1;
      ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nccl, nullptr), ncclSuccess)
          << (abort ? "after lowrankCommAbort: " : "after lowrankCommDestroy: ") << ncclGetLastError(nccl);
      EXPECT_EQ(x, 3);
    }
  });
}

// An error NCCL returns for one of the factor allreduces of a compressed call (here injected by the
// double into the second NCCL allreduce of a host buffer's second compressed call: P has been
// reduced, Q has not) fails the lowrank communicator, whatever NCCL's code: the comm ranks may be
// out of step on the NCCL communicator. Before, ncclInvalidUsage and ncclInvalidArgument passed
// through as plan-time usage errors that left the communicator usable. Every comm rank arms the
// same call on its own NCCL communicator, so none waits for a peer that never joins.
class NcclErrorMidCall : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(NcclErrorMidCall, FailsTheCommunicator) {
  const auto [ncclCode, pipeline] = GetParam();
  const int n = 2;
  withNcclComms(n, [&](int rank, ncclComm_t nccl) {
    lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
    cfg.approxRank = 2;
    cfg.startIter = 0;
    cfg.pipeline = pipeline;
    lowrankComm_t comm = nullptr;
    ASSERT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess) << lowrankGetLastError(nullptr);
    // A 64 x 48 float32 matrix, host memory, compressed from its first call.
    const size_t shape[2] = {64, 48};
    const size_t* shapes[1] = {shape};
    const int ndims[1] = {2};
    std::vector<float> g(64 * 48);
    ASSERT_EQ(lowrankBufferSetLayout(comm, g.data(), 1, ndims, shapes), lowrankSuccess) << lowrankGetLastError(comm);
    auto fill = [&] {
      for (size_t i = 0; i < g.size(); ++i) g[i] = float((i % 48) * (rank + 1)) * 0.01f + float(i / 48) * 0.02f;
    };
    fill();
    ASSERT_EQ(lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(comm);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    ASSERT_EQ(st.compressedCalls, 1u) << "the buffer should be compressed from its first call";

    // The second call (planned already: P then Q, at least two NCCL allreduces): its second fails.
    fill();
    ncclDoubleFailCollective(nccl, 2, ncclCode);
    const lowrankResult_t r =
        lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comm, nullptr);
    const std::string first = lowrankGetLastError(comm);
    EXPECT_EQ(r, lowrankResult_t(ncclCode)) << first;  // NCCL's code, mapped (the same number)
    EXPECT_TRUE(contains(first, "failure injected by ncclDoubleFailCollective")) << first;

    // Later calls are refused without any NCCL call (an armed failure would show as another code),
    // naming the first failure; exact calls and other buffers too.
    ncclDoubleFailCollective(nccl, 1, ncclSystemError);
    EXPECT_EQ(lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankInvalidUsage);
    const std::string later = lowrankGetLastError(comm);
    EXPECT_TRUE(contains(later, "earlier")) << later;
    EXPECT_TRUE(contains(later, "failure injected by ncclDoubleFailCollective")) << later;
    std::vector<int32_t> x(100, rank);
    EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankInt32, lowrankSum, comm, nullptr),
              lowrankInvalidUsage) << lowrankGetLastError(comm);
    ncclDoubleFailCollective(nccl, 0, ncclSuccess);  // disarmed, unused
    EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);

    // The NCCL communicator is the application's, and both comm ranks failed the same call: it
    // still works.
    int y = rank + 1;
    ASSERT_EQ(ncclAllReduce(&y, &y, 1, ncclInt32, ncclSum, nccl, nullptr), ncclSuccess) << ncclGetLastError(nccl);
    EXPECT_EQ(y, 3);
  });
}

INSTANTIATE_TEST_SUITE_P(
    NcclCodeAndPipeline, NcclErrorMidCall,
    ::testing::Combine(::testing::Values(int(ncclInvalidUsage), int(ncclInvalidArgument), int(ncclSystemError)),
                       ::testing::Values(0, 1)));

}  // namespace
