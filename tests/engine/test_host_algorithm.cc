// The host transport's cost model and forced algorithm as configured: LOWRANK_UCX_* variables
// resolved, and lowrankStats_t.bytesSent of a comm equal to the model of the algorithm it ran.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "api/config.h"
#include "support/ranks.h"
#include "transport/ucx/cost_model.h"
#include "support/env.h"

using namespace lowrank;

namespace {

using lowrank::testing::EnvGuard;
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

// The links are measured unless LOWRANK_UCX_PROBE=0; each constant set in the environment is
// pinned (kept over what is measured), the others are not.
TEST(HostAlgorithm, ProbeAndPinsFromEnvironment) {
  EnvGuard off("LOWRANK_UCX_PROBE", "");  // the test suite's own setting aside
  EngineConfig c;
  ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
  EXPECT_TRUE(c.ucxProbe);
  EXPECT_FALSE(c.ucxAlphaPinned || c.ucxBetaPinned || c.ucxOverheadPinned);
  EXPECT_EQ(c.ucxCost.overheadSec, 0);
  {
    EnvGuard o("LOWRANK_UCX_OVERHEAD_US", "2.5"), p("LOWRANK_UCX_PROBE", "0");
    ASSERT_TRUE(api::resolveConfig(nullptr, &c).ok());
    EXPECT_FALSE(c.ucxProbe);
    EXPECT_TRUE(c.ucxOverheadPinned);
    EXPECT_FALSE(c.ucxAlphaPinned || c.ucxBetaPinned);
    EXPECT_DOUBLE_EQ(c.ucxCost.overheadSec, 2.5e-6);
  }
  EnvGuard bad("LOWRANK_UCX_OVERHEAD_US", "-1");
  EXPECT_EQ(api::resolveConfig(nullptr, &c).code, lowrankInvalidUsage);
}

std::string transportInfo(lowrankComm_t comm) {
  size_t needed = 0;
  EXPECT_EQ(lowrankCommGetTransportInfo(comm, nullptr, 0, &needed), lowrankSuccess);
  std::string s(needed, '?');
  EXPECT_EQ(lowrankCommGetTransportInfo(comm, s.data(), s.size(), nullptr), lowrankSuccess);
  EXPECT_EQ(s.back(), '\0');
  s.pop_back();
  return s;
}

// A communicator measures its links when made, every comm rank ends with the same constants, and
// lowrankCommGetTransportInfo says so; with LOWRANK_UCX_PROBE=0 nothing is measured.
TEST(HostAlgorithm, TransportInfoSaysWhatWasMeasured) {
  constexpr int kRanks = 3;
  lowrankConfig_t cfg = lowrank::testing::config();
  cfg.approxRank = 0;
  for (const char* probe : {"1", "0"}) {
    EnvGuard p("LOWRANK_UCX_PROBE", probe);
    std::vector<std::string> infos(kRanks);
    lowrank::testing::withComms(kRanks, [&](int r, lowrankComm_t comm) {
      std::vector<float> x(1000, float(r));
      ASSERT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, comm,
                                 nullptr), lowrankSuccess) << lowrankGetLastError(comm);
      infos[size_t(r)] = transportInfo(comm);
      char small[8];
      size_t needed = 0;
      EXPECT_EQ(lowrankCommGetTransportInfo(comm, small, sizeof small, &needed), lowrankSuccess);
      EXPECT_EQ(needed, infos[size_t(r)].size() + 1);
      EXPECT_EQ(std::string(small), infos[size_t(r)].substr(0, 7));  // truncated, terminated
      EXPECT_EQ(lowrankCommGetTransportInfo(comm, nullptr, 4, nullptr), lowrankInvalidArgument);
    }, cfg);
    const bool measured = probe[0] == '1';
    for (int r = 0; r < kRanks; ++r) {
      const std::string& s = infos[size_t(r)];
      EXPECT_NE(s.find(measured ? "\"choice\": \"measured\"" : "\"choice\": \"given\""),
                std::string::npos) << s;
      EXPECT_EQ(s.find("\"probe\"") != std::string::npos, measured) << s;
      EXPECT_NE(s.find("\"algorithms\": {\"11\": \""), std::string::npos) << s;  // 4000 bytes
      // the constants in use: the same on every comm rank (the probe's own timings are not)
      const std::string head = s.substr(0, s.find(", \"probe\""));
      const std::string head0 = infos[0].substr(0, infos[0].find(", \"probe\""));
      EXPECT_EQ(head.substr(0, head.find(", \"algorithms\"")),
                head0.substr(0, head0.find(", \"algorithms\""))) << "comm rank " << r;
    }
  }
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
