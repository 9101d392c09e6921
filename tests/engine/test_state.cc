// Per-buffer state over many calls: error feedback converges, the residual stays bounded, state
// persists, resets and is released; mismatched plans are refused on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/data.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

TEST(State, ResidualBoundedAndCumulativeErrorFallsOver100Calls) {
  const int N = 2, calls = 100;
  const size_t n = 48, m = 64, count = n * m;
  auto make = [&](int r) { return decayingInput(n, m, r); };
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < N; ++r) {
    auto g = make(r);
    for (size_t i = 0; i < count; ++i) exact[i] += g[i];
  }
  std::vector<double> cumRel(calls), resid(calls);  // rank 0's view
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    std::vector<double> sum(count, 0.0);
    for (int t = 0; t < calls; ++t) {
      ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
      // Nothing is lost: sum_i E_i = (t+1) * exact - sum of outputs, so this is the residual.
      std::vector<double> d(count);
      for (size_t i = 0; i < count; ++i) {
        sum[i] += out[i];
        d[i] = (t + 1) * exact[i] - sum[i];
      }
      if (r == 0) {
        resid[t] = norm(d);
        cumRel[t] = norm(d) / ((t + 1) * norm(exact));
      }
    }
  }, config(2));
  EXPECT_GT(cumRel[0], 0.05);  // rank 2 of this input is lossy on one call ...
  EXPECT_LT(cumRel[9], 0.5 * cumRel[0]);
  EXPECT_LT(cumRel[99], 0.1 * cumRel[0]);  // ... but error feedback catches up
  EXPECT_LT(cumRel[99], cumRel[9]);
  // Bounded: without error feedback transmitting it, the residual would grow linearly (to about
  // 100 x resid[0] here); with it the growth is sublinear and levels off.
  EXPECT_LT(resid[99], 10.0 * resid[0]);
  EXPECT_LT(resid[99], 1.6 * resid[49]);
  for (double x : resid) ASSERT_TRUE(std::isfinite(x));
}

TEST(State, PersistsAcrossCallsAndResetRestartsBitForBit) {
  const int N = 2;
  const size_t n = 40, m = 40, count = n * m;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(n, m, r), first(count), second(count), again(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), first.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    // Same recvbuff: the residual and warm start are used, so the output changes.
    std::vector<float> buf(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), first.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    second = first;
    ASSERT_EQ(lowrankBufferReset(comm, first.data()), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g.data(), first.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    again = first;
    // A new buffer (no state) gives the first-call result, equal to the one after reset.
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    EXPECT_EQ(again, buf);
    EXPECT_NE(second, again);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, first.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.planned, 1);
    EXPECT_EQ(v.calls, 1u);
  });
}

TEST(State, CountOrDtypeChangeResetsAndReleaseFrees) {
  const int N = 2;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(32, 64, r), buf(2048), ref(2048);
    lowrankStats_t st0, st1, st2;
    ASSERT_EQ(lowrankGetStats(comm, &st0), lowrankSuccess);
    EXPECT_EQ(st0.stateBytes, 0u);
    ASSERT_EQ(lowrankAllReduce(g.data(), ref.data(), 2048, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), 2048, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), 1024, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.rows * v.cols, 1024u);
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), 2048, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    EXPECT_EQ(buf, ref) << "count changed twice: the state must have restarted";
    ASSERT_EQ(lowrankGetStats(comm, &st1), lowrankSuccess);
    EXPECT_EQ(st1.buffers, 2u);
    EXPECT_GE(st1.stateBytes, 2 * 2048 * sizeof(float));  // two residuals of 2048 floats
    ASSERT_EQ(lowrankBufferRelease(comm, buf.data()), lowrankSuccess);
    ASSERT_EQ(lowrankBufferRelease(comm, ref.data()), lowrankSuccess);
    ASSERT_EQ(lowrankGetStats(comm, &st2), lowrankSuccess);
    EXPECT_EQ(st2.buffers, 0u);
    EXPECT_EQ(st2.stateBytes, 0u);
  });
}

TEST(State, ErrorFeedbackOffKeepsNoResidual) {
  lowrankConfig_t cfg = config(2);
  cfg.errorFeedback = 0;
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(64, 64, r), a(4096), b(4096);
    ASSERT_EQ(lowrankAllReduce(g.data(), a.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_LT(st.stateBytes, 4096 * sizeof(float));  // factors only, no residual
    ASSERT_EQ(lowrankAllReduce(g.data(), a.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    for (float x : a) ASSERT_TRUE(std::isfinite(x));
  }, cfg);
}

TEST(State, MismatchedCountsAcrossRanksAreInvalidUsageOnEveryRank) {
  const int N = 3;
  std::vector<lowrankResult_t> res(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g(4096, 1.f);
    res[r] = lowrankAllReduce(g.data(), g.data(), r == 2 ? 4000 : 4096, lowrankFloat32, lowrankSum, comm, nullptr);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("disagree"), std::string::npos);
    // The ranks agreed on the refusal, so the communicator still works.
    EXPECT_EQ(lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(res[r], lowrankInvalidUsage) << "rank " << r;
}

// One comm rank's layout does not add up to the call's count: that rank's planning fails, and the
// others must fail the call too (not go on to a collective that rank never makes), after which
// the communicator still works on every rank.
TEST(State, OneRanksBadLayoutFailsTheCallOnEveryRankAndTheCommStaysUsable) {
  const int N = 3;
  std::vector<lowrankResult_t> res(N);
  std::vector<std::string> msg(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g(4096, 1.f);
    if (r == 0) {
      const int ndims[] = {2};
      const size_t shape[] = {10, 1000};  // 10000 elements, the call has 4096
      const size_t* shapes[] = {shape};
      ASSERT_EQ(lowrankBufferSetLayout(comm, g.data(), 1, ndims, shapes), lowrankSuccess);
    }
    res[r] = lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr);
    msg[r] = lowrankGetLastError(comm);
    if (r == 0) {
      ASSERT_EQ(lowrankBufferRelease(comm, g.data()), lowrankSuccess);  // the fix
    }
    std::fill(g.begin(), g.end(), 1.f);
    EXPECT_EQ(lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(comm);
    std::vector<int32_t> x(100, r);
    EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankInt32, lowrankSum, comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(comm);
    EXPECT_EQ(x[0], N * (N - 1) / 2);
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(res[r], lowrankInvalidUsage) << "rank " << r;
  EXPECT_NE(msg[0].find("layout holds 10000 elements"), std::string::npos) << msg[0];
  for (int r = 1; r < N; ++r)
    EXPECT_NE(msg[r].find("another comm rank could not plan"), std::string::npos) << msg[r];
}

// After the plan, a dtype change on one rank only is found by the transport, midway through a
// collective: the ranks are out of step, so the communicator is failed on every rank, and later
// calls say so (with the first error), instead of repeating a transport message.
TEST(State, MismatchFoundMidwayFailsTheCommWithAClearMessage) {
  const int N = 2;
  lowrankConfig_t cfg = config();
  cfg.timeoutSec = 10;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g(4096, 1.f);
    ASSERT_EQ(lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    const lowrankDataType_t dt = r == 1 ? lowrankFloat16 : lowrankFloat32;  // rank 1 re-plans
    EXPECT_NE(lowrankAllReduce(g.data(), g.data(), 4096, dt, lowrankSum, comm, nullptr),
              lowrankSuccess);
    std::vector<int32_t> x(100, r);
    EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankInt32, lowrankSum, comm, nullptr),
              lowrankInvalidUsage);
    const std::string m = lowrankGetLastError(comm);
    EXPECT_NE(m.find("failed at an earlier call"), std::string::npos) << m;
    EXPECT_NE(m.find("destroy it"), std::string::npos) << m;
  }, cfg);
}

// A bad layout set on one rank only after the buffer was planned: that rank re-plans alone, so the
// collectives meet out of step and the communicator fails; but the rank that made the mistake
// is told its own cause first.
TEST(State, LateBadLayoutOnOneRankNamesItsOwnCause) {
  lowrankConfig_t cfg = config();
  cfg.timeoutSec = 10;
  std::vector<std::string> msg(2);
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> g(4096, 1.f);
    ASSERT_EQ(lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    if (r == 0) {
      const int ndims[] = {2};
      const size_t shape[] = {10, 1000};
      const size_t* shapes[] = {shape};
      ASSERT_EQ(lowrankBufferSetLayout(comm, g.data(), 1, ndims, shapes), lowrankSuccess);
    }
    EXPECT_NE(lowrankAllReduce(g.data(), g.data(), 4096, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    msg[r] = lowrankGetLastError(comm);
  }, cfg);
  EXPECT_NE(msg[0].find("layout holds 10000 elements"), std::string::npos) << msg[0];
  EXPECT_NE(msg[0].find("on this rank only"), std::string::npos) << msg[0];
}

}  // namespace
