// The host transport's cost model and forced algorithm as configured: LOWRANK_UCX_* variables
// resolved, and lowrankStats_t.bytesSent of a comm equal to the model of the algorithm it ran.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "api/config.h"
#include "support/ranks.h"
#include "transport/ucx/cost_model.h"

using namespace lowrank;

namespace {

struct EnvGuard {
  const char* name;
  EnvGuard(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvGuard() { unsetenv(name); }
};

TEST(HostAlgorithm, CostAndAlgorithmFromEnvironment) {
  EngineConfig c;
  ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
  EXPECT_FALSE(c.ucxAlgorithm.has_value());
  EXPECT_DOUBLE_EQ(c.ucxCost.alphaSec, 5e-6);
  EXPECT_DOUBLE_EQ(c.ucxCost.betaSecPerByte, 0.08e-9);
  {
    EnvGuard a("LOWRANK_UCX_ALPHA_US", "250"), b("LOWRANK_UCX_BETA_NS", "8"),
        g("LOWRANK_UCX_ALGO", "Recursive_Doubling");
    ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
    EXPECT_DOUBLE_EQ(c.ucxCost.alphaSec, 250e-6);
    EXPECT_DOUBLE_EQ(c.ucxCost.betaSecPerByte, 8e-9);
    ASSERT_TRUE(c.ucxAlgorithm.has_value());
    EXPECT_EQ(*c.ucxAlgorithm, ucx::Algorithm::RecursiveDoubling);
  }
  EXPECT_FALSE(c.ucxTune);  // the default: the cost model, nothing measured
  {
    EnvGuard g("LOWRANK_UCX_ALGO", "Tune");
    ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
    EXPECT_TRUE(c.ucxTune);
    EXPECT_FALSE(c.ucxAlgorithm.has_value());
  }
  {
    EnvGuard g("LOWRANK_UCX_ALGO", "tuned");
    const Status st = api::resolveConfig(nullptr, &c);
    EXPECT_EQ(st.code, lowrankInvalidUsage);
    EXPECT_NE(st.msg.find("tune"), std::string::npos) << st.msg;  // the accepted values are named
  }
  EnvGuard g("LOWRANK_UCX_ALGO", "auto");
  ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
  EXPECT_FALSE(c.ucxAlgorithm.has_value());
  EXPECT_FALSE(c.ucxTune);
}

// Exact allreduces (k = 0) of 1001 floats over 5 comm ranks, each algorithm forced: the stats
// count what the model says that algorithm sends, comm rank by comm rank.
TEST(HostAlgorithm, StatsBytesSentIsTheModelOfTheAlgorithmRun) {
  constexpr int kRanks = 5;
  constexpr size_t kCount = 1001;
  lowrankConfig_t cfg = lowrank::testing::config();
  cfg.approxRank = 0;
  for (int i = 0; i < ucx::kNumAlgorithms; ++i) {
    const auto a = ucx::Algorithm(i);
    EnvGuard g("LOWRANK_UCX_ALGO", ucx::algorithmName(a));
    lowrank::testing::withComms(kRanks, [&](int r, lowrankComm_t comm) {
      std::vector<float> x(kCount, float(r));
      ASSERT_EQ(lowrankAllReduce(x.data(), x.data(), kCount, lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      EXPECT_EQ(x[kCount - 1], 10.0f);
      lowrankStats_t st;
      ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
      EXPECT_EQ(st.bytesSent, ucx::bytesSent(a, kRanks, r, kCount, sizeof(float)))
          << ucx::algorithmName(a) << " comm rank " << r;
    }, cfg);
  }
}

}  // namespace

// LOWRANK_UCX_ALGO=tune through the API: exact allreduces (k = 0) over 3 comm ranks stay correct
// through the trials (4 candidates x 3 repeats), the agreement and after the freeze.
TEST(HostAlgorithm, TunedCommsGiveCorrectSums) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 1001;
  lowrankConfig_t cfg = lowrank::testing::config();
  cfg.approxRank = 0;
  EnvGuard g("LOWRANK_UCX_ALGO", "tune");
  lowrank::testing::withComms(kRanks, [&](int r, lowrankComm_t comm) {
    for (int call = 0; call < 16; ++call) {
      std::vector<float> x(kCount, float(r + call));
      ASSERT_EQ(lowrankAllReduce(x.data(), x.data(), kCount, lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      EXPECT_EQ(x[0], float(3 + 3 * call)) << "call " << call;
      EXPECT_EQ(x[kCount - 1], float(3 + 3 * call)) << "call " << call;
    }
  }, cfg);
}
