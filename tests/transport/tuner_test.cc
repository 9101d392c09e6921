// Online tuning of the host allreduce (LOWRANK_UCX_ALGO=tune, tuner.h): the bookkeeping alone,
// then over UCX with comm ranks as threads: every rank freezes the same algorithm even when each
// is fed its own timings, that algorithm is the argmin of the max over ranks, and every call,
// trial or not, is a correct allreduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "tests/transport/support.h"
#include "transport/ucx/tuner.h"
#include "util/dtype.h"

namespace lowrank::test {
namespace {

using ucx::Algorithm;
using ucx::Tuner;
using ucx::TuneResult;

TEST(Tuner, TrialsRoundRobinThenTheFrozenArgmin) {
  Tuner t(4, 64, 3);
  const std::vector<Algorithm> all = {Algorithm::Ring, Algorithm::HalvingDoubling,
                                      Algorithm::RecursiveDoubling, Algorithm::Direct};
  ASSERT_EQ(t.candidates(), all);
  ASSERT_EQ(t.trialsPerClass(), 12);
  const double bytes = 4000;  // class 11, [2048, 4096)
  EXPECT_EQ(Tuner::sizeClass(bytes), 11);
  // Per candidate: three timings whose median is not their mean nor the last one.
  const double sec[4][3] = {{9, 3, 4}, {2, 50, 6}, {5, 5, 1}, {7, 8, 100}};
  for (int i = 0; i < 12; ++i) {
    const Tuner::Plan p = t.plan(bytes);
    ASSERT_TRUE(p.trial);
    ASSERT_EQ(p.algo, all[size_t(i % 4)]) << "trial " << i;
    EXPECT_EQ(t.record(bytes, sec[i % 4][i / 4]), i == 11) << "trial " << i;
  }
  EXPECT_EQ(t.localTimings(bytes), (std::vector<double>{4, 6, 5, 8}));
  // Another class is untouched: its first trial is the ring's.
  EXPECT_TRUE(t.plan(100).trial);
  // The choice is the argmin of what it is given (agreed), not of its own medians.
  const TuneResult& r = t.freeze(bytes, {7, 9, 3, 8});
  EXPECT_EQ(r.choice, Algorithm::RecursiveDoubling);
  EXPECT_EQ(r.localSec, (std::vector<double>{4, 6, 5, 8}));
  const Tuner::Plan after = t.plan(2048);  // the same class
  EXPECT_FALSE(after.trial);
  EXPECT_EQ(after.algo, Algorithm::RecursiveDoubling);
  EXPECT_FALSE(t.record(bytes, 1));  // frozen: nothing more recorded
}

TEST(Tuner, TiesGoToTheEarlierCandidateAndDirectNeedsFewRanks) {
  Tuner t(8, 4, 1);  // 8 ranks > directMaxRanks 4: direct is no candidate
  ASSERT_EQ(t.candidates().size(), 3u);
  EXPECT_EQ(std::count(t.candidates().begin(), t.candidates().end(), Algorithm::Direct), 0);
  for (int i = 0; i < 3; ++i) t.record(64, 1);
  EXPECT_EQ(t.freeze(64, {2, 1, 1}).choice, Algorithm::HalvingDoubling);
}

// Collects each rank's TuneResults (onTuned runs on the rank's thread).
struct Results {
  std::mutex m;
  std::vector<std::vector<TuneResult>> byRank;
  explicit Results(int n) : byRank(size_t(n)) {}
  std::function<void(const TuneResult&)> sink(int r) {
    return [this, r](const TuneResult& x) {
      std::lock_guard<std::mutex> g(m);
      byRank[size_t(r)].push_back(x);
    };
  }
};

// Each rank is fed its own timings, so the ranks' local argmins differ; every rank must still
// freeze the same algorithm, the argmin of the max over ranks, and keep giving correct sums (a rank
// that chose alone would run another algorithm than its peers: its calls fail at the timeout).
TEST(TunedTransport, RanksFedDifferentTimingsChooseTheSame) {
  for (int n = 2; n <= 5; ++n) {
    SCOPED_TRACE("world " + std::to_string(n));
    constexpr int kCandidates = ucx::kNumAlgorithms;  // n <= 64: direct is one
    // Rank r's seconds for candidate j; no two equal, and rank r's fastest is candidate r % 4.
    auto fed = [](int r, int j) { return j == r % 4 ? 1e-3 : 2e-3 + 1e-4 * ((r * 3 + j * 5) % 7) + 1e-6 * j; };
    std::vector<double> maxOverRanks(kCandidates, 0);
    for (int j = 0; j < kCandidates; ++j)
      for (int r = 0; r < n; ++r) maxOverRanks[size_t(j)] = std::max(maxOverRanks[size_t(j)], fed(r, j));
    const auto expected = Algorithm(std::min_element(maxOverRanks.begin(), maxOverRanks.end()) -
                                    maxOverRanks.begin());
    Results res(n);
    std::vector<std::vector<Algorithm>> tried(static_cast<size_t>(n));  // each rank's trials, in order
    auto g = makeGroup(n, 5, [&](int r) {
      UcxTransportOptions o;
      o.tune = true;
      o.tuneRepeats = 2;
      o.tuneTimer = [r, &fed, &tried](Algorithm a, double measured) {
        EXPECT_GT(measured, 0);
        tried[size_t(r)].push_back(a);
        return fed(r, int(a));
      };
      o.onTuned = res.sink(r);
      return o;
    });
    ASSERT_EQ(g.size(), size_t(n));
    const int trials = kCandidates * 2;
    for (int call = 0; call < trials + 3; ++call) {
      checkExactFloatSum(g, 1001, uint32_t(call));
      if (HasFatalFailure()) return;
    }
    std::vector<Algorithm> roundRobin;  // every candidate twice, in enum order
    for (int i = 0; i < trials; ++i) roundRobin.push_back(Algorithm(i % kCandidates));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(tried[size_t(r)], roundRobin) << "comm rank " << r;
      ASSERT_EQ(res.byRank[size_t(r)].size(), 1u) << "comm rank " << r;
      const TuneResult& x = res.byRank[size_t(r)][0];
      EXPECT_EQ(x.sizeClass, 11);  // 4004 bytes
      EXPECT_EQ(x.agreedSec, maxOverRanks) << "comm rank " << r;
      EXPECT_EQ(x.localSec[size_t(r % 4)], 1e-3) << "comm rank " << r;
      EXPECT_EQ(x.choice, expected) << "comm rank " << r << " chose " << ucx::algorithmName(x.choice)
                                    << ", the agreed argmin is " << ucx::algorithmName(expected);
    }
  }
}

// Real timings (each rank its own clock): correct sums during and after the trials, at several
// sizes (several size classes tuned at once, interleaved as an engine's calls are), one choice
// per class on every rank.
TEST(TunedTransport, CorrectAllreducesDuringAndAfterTuning) {
  const size_t counts[] = {1, 7, 1001, 70001};  // 4 B .. 280 KB: four size classes
  for (int n = 2; n <= 5; ++n) {
    SCOPED_TRACE("world " + std::to_string(n));
    Results res(n);
    auto g = makeGroup(n, 30, [&](int r) {
      UcxTransportOptions o;
      o.tune = true;
      o.tuneRepeats = 2;
      o.chunkBytes = 16384;  // several ring chunks at the largest size
      o.onTuned = res.sink(r);
      return o;
    });
    ASSERT_EQ(g.size(), size_t(n));
    const int calls = ucx::kNumAlgorithms * 2 + 2;
    uint32_t seed = 1;
    for (int call = 0; call < calls; ++call)
      for (size_t c : counts) {
        checkExactFloatSum(g, c, seed++);
        if (HasFatalFailure()) return;
      }
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(res.byRank[size_t(r)].size(), std::size(counts)) << "comm rank " << r;
      for (size_t k = 0; k < std::size(counts); ++k) {
        const TuneResult& x = res.byRank[size_t(r)][k];
        EXPECT_EQ(x.sizeClass, Tuner::sizeClass(double(counts[k] * 4)));
        EXPECT_EQ(x.choice, res.byRank[0][k].choice) << "comm rank " << r << ", count " << counts[k];
        EXPECT_EQ(x.agreedSec, res.byRank[0][k].agreedSec) << "comm rank " << r;
        for (size_t j = 0; j < x.localSec.size(); ++j) EXPECT_LE(x.localSec[j], x.agreedSec[j]);
      }
    }
  }
}

// A forced algorithm wins over tune: nothing is tried, nothing agreed.
TEST(TunedTransport, ForcedAlgorithmIsNotTuned) {
  Results res(2);
  auto g = makeGroup(2, 30, [&](int r) {
    UcxTransportOptions o;
    o.tune = true;
    o.algorithm = Algorithm::Ring;
    o.onTuned = res.sink(r);
    return o;
  });
  ASSERT_EQ(g.size(), 2u);
  for (int call = 0; call < 10; ++call) checkExactFloatSum(g, 100, uint32_t(call));
  EXPECT_TRUE(res.byRank[0].empty());
  // Ring only: 2(N-1) * count elements over the group per call, no agreement's messages.
  EXPECT_EQ(elementsSent(g), uint64_t(10) * 2 * 100);
}

}  // namespace
}  // namespace lowrank::test
