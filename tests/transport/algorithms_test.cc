// Every host allreduce algorithm, forced, at 2, 3, 4, 5, 8 and 16 comm ranks (threads): the result
// equals the exact reduction, every rank holds the same bits (also for inexact float sums), and
// each rank's bytesSent grows by exactly what the cost model says (cost_model.h). And a peer that
// leaves gives every survivor an error, for the algorithms with a fold.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "tests/transport/support.h"
#include "util/dtype.h"

namespace lowrank::test {
namespace {

using ucx::Algorithm;
const Algorithm kAlgorithms[] = {Algorithm::Ring, Algorithm::HalvingDoubling,
                                 Algorithm::RecursiveDoubling, Algorithm::Direct};

UcxTransportOptions forced(Algorithm a) {
  UcxTransportOptions o;
  o.algorithm = a;
  o.chunkBytes = 4096;  // the ring, halving + doubling: several chunks at the larger counts
  return o;
}

// Counts: one element, fewer elements than ranks, not divisible by n or by the folded world, larger.
std::vector<size_t> countsFor(int n) {
  std::vector<size_t> c = {1, size_t(n) + 1, 1001, 4099};
  if (n > 2) c.push_back(size_t(n) - 1);
  return c;
}

// One allreduce of exact data; checks the result on every rank and each rank's bytesSent.
void checkCall(std::vector<std::unique_ptr<Transport>>& g, Algorithm a, size_t count,
               lowrankDataType_t dt, lowrankRedOp_t op, uint32_t seed) {
  const int n = int(g.size());
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n)), bufs;
  std::vector<uint64_t> before;
  for (int r = 0; r < n; ++r) {
    in[size_t(r)] = exactData(dt, op, r, count, seed);
    before.push_back(g[size_t(r)]->counters().bytesSent.load());
  }
  const auto ref = referenceReduce(in, count, dt, op);
  bufs = in;
  const auto sts = allreduceAll(g, bufs, count, dt, op);
  const std::string what = std::string(ucx::algorithmName(a)) + " n " + std::to_string(n) + " count " +
                           std::to_string(count) + " " + dtypeName(dt) + " " + opName(op);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << what << ": " << sts[size_t(r)].msg;
    ASSERT_EQ(firstDiff(bufs[size_t(r)], ref, dtypeSize(dt)), -1) << what << ", comm rank " << r;
    EXPECT_EQ(g[size_t(r)]->counters().bytesSent.load() - before[size_t(r)],
              ucx::bytesSent(a, n, r, count, dtypeSize(dt)))
        << what << ", comm rank " << r;
  }
}

// Random normal floats: the sum is inexact, so the order of reduction shows; every rank must hold
// comm rank 0's bits.
void checkSameBits(std::vector<std::unique_ptr<Transport>>& g, Algorithm a, size_t count) {
  const int n = int(g.size());
  std::mt19937 rng(uint32_t(count) * 31 + uint32_t(n));
  std::normal_distribution<float> nd(0, 100);
  std::vector<std::vector<uint8_t>> bufs(size_t(n), std::vector<uint8_t>(count * 4));
  for (auto& b : bufs)
    for (size_t i = 0; i < count; ++i) {
      float f = nd(rng);
      std::memcpy(&b[4 * i], &f, 4);
    }
  const auto sts = allreduceAll(g, bufs, count, lowrankFloat32, lowrankSum);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << sts[size_t(r)].msg;
    EXPECT_EQ(firstDiff(bufs[size_t(r)], bufs[0], 4), -1)
        << ucx::algorithmName(a) << " n " << n << " count " << count << ": comm rank " << r;
  }
}

class EveryAlgorithm : public ::testing::TestWithParam<Algorithm> {};

TEST_P(EveryAlgorithm, ExactSameBitsAndBytesAsModelled) {
  const Algorithm a = GetParam();
  for (int n : {2, 3, 4, 5, 8, 16}) {
    auto g = makeGroup(n, 60, forced(a));
    ASSERT_EQ(g.size(), size_t(n));
    uint32_t seed = 1;
    for (size_t count : countsFor(n)) {
      checkCall(g, a, count, lowrankFloat32, lowrankSum, seed++);
      checkCall(g, a, count, lowrankFloat32, lowrankAvg, seed++);
      if (HasFatalFailure()) return;
    }
    // Other element sizes and operations (max and min keep the lower rank's operand on ties).
    checkCall(g, a, 333, lowrankBfloat16, lowrankMax, seed++);
    checkCall(g, a, 333, lowrankInt64, lowrankProd, seed++);
    checkCall(g, a, 333, lowrankInt8, lowrankMin, seed++);
    for (size_t count : {size_t(1), size_t(n) - 1, size_t(10007)})
      if (count) checkSameBits(g, a, count);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, EveryAlgorithm, ::testing::ValuesIn(kAlgorithms),
                         [](const ::testing::TestParamInfo<Algorithm>& i) {
                           std::string s = ucx::algorithmName(i.param);
                           s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
                           return s;
                         });

// Halving + doubling in chunks (tiny ones, 1..4 in flight) against itself unchunked (one message
// per step, the algorithm before chunking): the same bits on every rank, also for inexact float
// sums, at worlds 2..8 (non-powers of two fold) and counts that leave chunks and blocks uneven.
TEST(HalvingDoublingChunks, SameBitsAsUnchunked) {
  const size_t counts[] = {1, 7, 1001, 4099};
  for (int n = 2; n <= 8; ++n) {
    UcxTransportOptions whole = forced(Algorithm::HalvingDoubling);
    whole.chunkBytes = size_t(1) << 30;  // every step's half is one message
    auto ref = makeGroup(n, 60, whole);
    ASSERT_EQ(ref.size(), size_t(n));
    for (auto [chunkBytes, inflight] : {std::pair<size_t, int>{4, 1}, {12, 2}, {100, 4}}) {
      UcxTransportOptions o = forced(Algorithm::HalvingDoubling);
      o.chunkBytes = chunkBytes;  // 1, 3, 25 floats a chunk
      o.inflight = inflight;
      auto g = makeGroup(n, 60, o);
      ASSERT_EQ(g.size(), size_t(n));
      for (size_t count : counts) {
        if (chunkBytes == 4 && count > 1001) continue;  // one float a message: thousands, no new case
        for (lowrankRedOp_t op : {lowrankSum, lowrankAvg}) {
          std::mt19937 rng(uint32_t(count * 131 + size_t(n) * 7 + chunkBytes));
          std::normal_distribution<float> nd(0, 100);
          std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * 4));
          for (auto& b : in)
            for (size_t i = 0; i < count; ++i) {
              const float f = nd(rng);
              std::memcpy(&b[4 * i], &f, 4);
            }
          auto want = in, got = in;
          const auto refSts = allreduceAll(ref, want, count, lowrankFloat32, op);
          const auto sts = allreduceAll(g, got, count, lowrankFloat32, op);
          for (int r = 0; r < n; ++r) {
            const std::string what = "n " + std::to_string(n) + " count " + std::to_string(count) +
                                     " chunk " + std::to_string(chunkBytes) + " B, inflight " +
                                     std::to_string(inflight) + " " + opName(op) + ", comm rank " +
                                     std::to_string(r);
            ASSERT_TRUE(refSts[size_t(r)].ok() && sts[size_t(r)].ok()) << what << ": " << sts[size_t(r)].msg;
            ASSERT_EQ(firstDiff(got[size_t(r)], want[size_t(r)], 4), -1) << what;
            ASSERT_EQ(firstDiff(got[size_t(r)], got[0], 4), -1) << what;
          }
        }
      }
    }
  }
}

// A comm rank that leaves (here an extra rank of the fold, then a core rank) while the others
// allreduce: every survivor returns an error within the timeout, none hangs.
class PeerLeaves : public ::testing::TestWithParam<Algorithm> {};

TEST_P(PeerLeaves, EverySurvivorGetsAnError) {
  using Clock = std::chrono::steady_clock;
  const Algorithm a = GetParam();
  for (int gone : {0, 3}) {  // of 5: comm rank 0 folds into 1; 3 is a core rank
    auto g = makeGroup(5, 2.0, forced(a));
    ASSERT_EQ(g.size(), 5u);
    g[size_t(gone)].reset();
    std::vector<std::vector<float>> x(5, std::vector<float>(5000, 1.0f));
    std::vector<Status> sts(5);
    const auto t0 = Clock::now();
    runRanks(5, [&](int r) {
      if (r != gone) sts[size_t(r)] = g[size_t(r)]->allreduce(x[size_t(r)].data(), 5000, lowrankFloat32, lowrankSum);
    });
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 6.0);
    for (int r = 0; r < 5; ++r) {
      if (r == gone) continue;
      EXPECT_TRUE(sts[size_t(r)].code == lowrankRemoteError || sts[size_t(r)].code == lowrankTimeout)
            << ucx::algorithmName(a) << " comm rank " << r << ": " << sts[size_t(r)].code << " "
            << sts[size_t(r)].msg;
    }
    g.clear();
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, PeerLeaves,
                         ::testing::Values(Algorithm::RecursiveDoubling, Algorithm::HalvingDoubling),
                         [](const ::testing::TestParamInfo<Algorithm>& i) {
                           std::string s = ucx::algorithmName(i.param);
                           s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
                           return s;
                         });

}  // namespace
}  // namespace lowrank::test
