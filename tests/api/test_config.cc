// Configuration: explicit fields win, LOWRANK_* variables fill unset ones, bad values are errors
// naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/ranks.h"
#include "support/env.h"

namespace {

// Inits a one-rank comm with cfg (null = none) under the environment; returns its result.
lowrankResult_t initWith(lowrankConfig_t* cfg, lowrankComm_t* out = nullptr) {
  lowrankUniqueId id;
  // lowrankGetUniqueId reads LOWRANK_TIMEOUT too, and refuses a bad one the same way.
  if (lowrankResult_t r = lowrankGetUniqueId(&id); r != lowrankSuccess) return r;
  lowrankComm_t c = nullptr;
  lowrankResult_t r = lowrankCommInitRankConfig(&c, 1, id, 0, cfg);
  if (out) *out = c;
  else if (c) lowrankCommDestroy(c);
  return r;
}

using lowrank::testing::EnvGuard;
TEST(Config, MalformedVariablesAreErrorsNamingThem) {
  const char* cases[][2] = {{"LOWRANK_APPROX_RANK", "four"},    {"LOWRANK_APPROX_RANK", "-1"},
                            {"LOWRANK_MIN_COMPRESSION_RATE", "0.5"}, {"LOWRANK_START_ITER", "1.5"},
                            {"LOWRANK_ERROR_FEEDBACK", "maybe"}, {"LOWRANK_WARM_START", "2"},
                            {"LOWRANK_ORTHO_EPSILON", "-1"},     {"LOWRANK_SEED", "-3"},
                            {"LOWRANK_SEED", "9223372036854775808"},  // 2^63: no long long
                            {"LOWRANK_TIMEOUT", "0"},            {"LOWRANK_TIMEOUT", "10s"},
                            {"LOWRANK_DEBUG", "LOUD"},
                            {"LOWRANK_UCX_ALPHA_US", "0"},       {"LOWRANK_UCX_BETA_NS", "-1"},
                            {"LOWRANK_UCX_BETA_NS", "fast"},     {"LOWRANK_UCX_ALGO", "tree"},
                            {"LOWRANK_UCX_ALGO", "tuned"},       {"LOWRANK_HOST_ISA", "sse"}};
  for (auto& c : cases) {
    EnvGuard g(c[0], c[1]);
    EXPECT_EQ(initWith(nullptr), lowrankInvalidUsage) << c[0] << "=" << c[1];
    EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find(c[0]), std::string::npos)
        << lowrankGetLastError(nullptr);
  }
}

// Whether one compressible call on this comm was compressed.
bool compresses(lowrankComm_t c) {
  std::vector<float> x(4096, 1.f);
  EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, c, nullptr), lowrankSuccess);
  lowrankStats_t st;
  EXPECT_EQ(lowrankGetStats(c, &st), lowrankSuccess);
  return st.compressedCalls == 1;
}

TEST(Config, ExplicitFieldsWinEnvironmentFillsTheRest) {
  EnvGuard g("LOWRANK_APPROX_RANK", "0");
  lowrankComm_t c = nullptr;
  ASSERT_EQ(initWith(nullptr, &c), lowrankSuccess);
  EXPECT_FALSE(compresses(c)) << "LOWRANK_APPROX_RANK=0 fills an unset field";
  lowrankCommDestroy(c);
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 4;
  ASSERT_EQ(initWith(&cfg, &c), lowrankSuccess);
  EXPECT_TRUE(compresses(c)) << "an explicit field wins over the environment";
  lowrankCommDestroy(c);
  unsetenv("LOWRANK_APPROX_RANK");
  ASSERT_EQ(initWith(nullptr, &c), lowrankSuccess);
  EXPECT_TRUE(compresses(c)) << "default k = 4";
  lowrankCommDestroy(c);
}

// The largest seed the environment takes is one lowrankConfig_t.seed can give back: the config
// read with lowrankCommGetConfig makes a communicator again.
TEST(Config, LargestSeedRoundTrips) {
  EnvGuard g("LOWRANK_SEED", "9223372036854775807");
  lowrankComm_t c = nullptr;
  ASSERT_EQ(initWith(nullptr, &c), lowrankSuccess);
  lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
  ASSERT_EQ(lowrankCommGetConfig(c, &got), lowrankSuccess);
  lowrankCommDestroy(c);
  EXPECT_EQ(got.seed, 9223372036854775807LL);
  unsetenv("LOWRANK_SEED");
  ASSERT_EQ(initWith(&got, &c), lowrankSuccess) << lowrankGetLastError(nullptr);
  lowrankCommDestroy(c);
}

TEST(Config, GetConfigReportsTheValuesInForce) {
  EnvGuard g("LOWRANK_START_ITER", "3");
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 2;
  lowrankComm_t c = nullptr;
  ASSERT_EQ(initWith(&cfg, &c), lowrankSuccess);
  lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
  ASSERT_EQ(lowrankCommGetConfig(c, &got), lowrankSuccess);
  EXPECT_EQ(got.approxRank, 2);           // explicit
  EXPECT_EQ(got.startIter, 3);            // environment
  EXPECT_EQ(got.minCompressionRate, 2.0); // default
  EXPECT_EQ(got.errorFeedback, 1);
  EXPECT_EQ(got.pipeline, 1);
  EXPECT_EQ(lowrankCommGetConfig(c, nullptr), lowrankInvalidArgument);
  lowrankConfig_t bad = LOWRANK_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_EQ(lowrankCommGetConfig(c, &bad), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommGetConfig(nullptr, &got), lowrankInvalidArgument);
  lowrankCommDestroy(c);
}

TEST(Config, StartIterFromEnvironment) {
  EnvGuard g("LOWRANK_START_ITER", "1");
  lowrankComm_t c = nullptr;
  ASSERT_EQ(initWith(nullptr, &c), lowrankSuccess);
  EXPECT_FALSE(compresses(c));
  lowrankCommDestroy(c);
}

}  // namespace
