// The cost model as pure functions (cost_model.h): steps, bytes per comm rank against independent
// counts, and the choice at a few points where the answer is known.
#include <gtest/gtest.h>

#include <algorithm>

#include "transport/ucx/cost_model.h"

namespace lowrank::ucx {
namespace {

TEST(CostModel, Steps) {
  EXPECT_EQ(steps(Algorithm::Ring, 16), 30);
  EXPECT_EQ(steps(Algorithm::Direct, 16), 1);
  EXPECT_EQ(steps(Algorithm::RecursiveDoubling, 16), 4);
  EXPECT_EQ(steps(Algorithm::HalvingDoubling, 16), 8);
  // 5 = 4 + 1: the fold adds a step in and a step out.
  EXPECT_EQ(steps(Algorithm::RecursiveDoubling, 5), 4);
  EXPECT_EQ(steps(Algorithm::HalvingDoubling, 5), 6);
  EXPECT_EQ(steps(Algorithm::RecursiveDoubling, 2), 1);
  EXPECT_EQ(steps(Algorithm::RecursiveDoubling, 4096), 12);
  EXPECT_EQ(foldedWorld(4095), 2048);
  EXPECT_EQ(log2Floor(4096), 12);
}

TEST(CostModel, BytesPerCommRank) {
  for (int n : {2, 3, 4, 5, 6, 7, 8, 12, 16, 33}) {
    const int p = foldedWorld(n), lg = log2Floor(n), r = n - p;
    for (size_t count : {size_t(1), size_t(n) - 1, size_t(n), size_t(1000003)}) {
      if (!count) continue;
      uint64_t ring = 0, hd = 0, hdMax = 0, rdMax = 0;
      for (int rank = 0; rank < n; ++rank) {
        EXPECT_EQ(bytesSent(Algorithm::Direct, n, rank, count, 4), uint64_t(n - 1) * count * 4);
        const bool extra = rank < 2 * r && rank % 2 == 0, partner = rank < 2 * r && rank % 2 == 1;
        const uint64_t rd = bytesSent(Algorithm::RecursiveDoubling, n, rank, count, 2);
        EXPECT_EQ(rd, extra ? count * 2 : (uint64_t(lg) + partner) * count * 2) << n << " " << rank;
        ring += bytesSent(Algorithm::Ring, n, rank, count, 4);
        const uint64_t h = bytesSent(Algorithm::HalvingDoubling, n, rank, count, 4);
        if (!extra) hd += h - (partner ? count * 4 : 0);
        hdMax = std::max(hdMax, h);
        rdMax = std::max(rdMax, rd);
      }
      // The ring moves 2(n-1) buffers over all ranks; the halving's core ranks 2(p-1) buffers.
      EXPECT_EQ(ring, uint64_t(2 * (n - 1)) * count * 4) << n << " " << count;
      EXPECT_EQ(hd, uint64_t(2 * (p - 1)) * count * 4) << n << " " << count;
      // The nominal busiest rank is within one element per step of the exact one.
      EXPECT_NEAR(double(rdMax), busiestBytes(Algorithm::RecursiveDoubling, n, count * 2.0), 0.5);
      EXPECT_NEAR(double(hdMax), busiestBytes(Algorithm::HalvingDoubling, n, count * 4.0),
                  4.0 * steps(Algorithm::HalvingDoubling, n));
    }
  }
  EXPECT_EQ(bytesSent(Algorithm::Ring, 4, 0, 0, 4), 0u);
  EXPECT_EQ(bytesSent(Algorithm::HalvingDoubling, 1, 0, 10, 4), 0u);
}

TEST(CostModel, Choice) {
  const CostParams c;  // 5 us, 0.08 ns per byte
  // Tiny buffers, few ranks: one step wins.
  EXPECT_EQ(choose(16, 8, c, 64), Algorithm::Direct);
  EXPECT_EQ(choose(16, 8, c, 8), Algorithm::RecursiveDoubling);  // direct not allowed at 16
  // Many ranks: log-depth, whatever the payload PowerSGD sends.
  EXPECT_EQ(choose(1024, 2128, c, 64), Algorithm::RecursiveDoubling);
  EXPECT_EQ(choose(1024, 4 << 20, c, 64), Algorithm::HalvingDoubling);
  // Large buffers: the ring's bytes, and halving's fewer steps where the world is a power of two.
  EXPECT_EQ(choose(16, 1 << 26, c, 64), Algorithm::HalvingDoubling);
  EXPECT_EQ(choose(12, 1 << 26, c, 64), Algorithm::Ring);  // the fold costs a whole buffer more
  // Ties go to the earlier algorithm: at 2 ranks direct and recursive doubling are the same exchange.
  EXPECT_EQ(choose(2, 100, c, 64), Algorithm::RecursiveDoubling);
  EXPECT_EQ(choose(2, 1 << 30, c, 64), Algorithm::RecursiveDoubling);
  // A slow link: the 16-rank bucket of the issue (2,128 B) no longer goes direct at 1 Gbit/s.
  const CostParams slow{5e-6, 8e-9};
  EXPECT_EQ(choose(16, 2128, c, 64), Algorithm::Direct);
  EXPECT_EQ(choose(16, 2128, slow, 64), Algorithm::HalvingDoubling);
  // LogP's o: direct handles 2(n-2) messages more than one send and one receive per step, so a
  // per-message overhead moves a small buffer from direct (1 step) to recursive doubling (3 steps).
  EXPECT_EQ(extraMessages(Algorithm::Direct, 8), 12);
  EXPECT_EQ(extraMessages(Algorithm::Ring, 8), 0);
  const CostParams noOverhead{10e-6, 0.08e-9, 0}, overhead{10e-6, 0.08e-9, 5e-6};
  EXPECT_EQ(choose(8, 64, noOverhead, 64), Algorithm::Direct);
  EXPECT_EQ(choose(8, 64, overhead, 64), Algorithm::RecursiveDoubling);
  // Within kNearMargin of the fastest, the fewest bytes: at 16 ranks, 1 ms and 20 ns per byte,
  // 64 KiB takes recursive doubling 9.2 ms (4 buffers sent) and halving + doubling 10.5 ms (15/8
  // of one): the model cannot tell them apart, so halving + doubling; at 10 ns per byte (6.6 against
  // 9.2 ms) it can, and recursive doubling stays.
  const CostParams near{1e-3, 20e-9}, far{1e-3, 10e-9};
  ASSERT_LT(modelledSeconds(Algorithm::RecursiveDoubling, 16, 65536, near),
            modelledSeconds(Algorithm::HalvingDoubling, 16, 65536, near));
  ASSERT_LT(modelledSeconds(Algorithm::HalvingDoubling, 16, 65536, near),
            (1 + kNearMargin) * modelledSeconds(Algorithm::RecursiveDoubling, 16, 65536, near));
  EXPECT_EQ(choose(16, 65536, near, 64), Algorithm::HalvingDoubling);
  EXPECT_EQ(choose(16, 65536, far, 64), Algorithm::RecursiveDoubling);
  // Equal bytes (the ring and halving + doubling at a power of two): the faster.
  EXPECT_EQ(choose(4, 1 << 20, CostParams{1e-6, 80e-9}, 64), Algorithm::HalvingDoubling);
  EXPECT_DOUBLE_EQ(modelledSeconds(Algorithm::Direct, 8, 64, overhead),
                   10e-6 + 12 * 5e-6 + 7 * 64 * 0.08e-9);
  // The choice is within kNearMargin of the least modelled time, and nothing that close sends fewer
  // bytes.
  for (const CostParams& k : {c, slow, overhead, near})
    for (int n : {2, 3, 7, 16, 100, 4096})
      for (double b : {4.0, 1e3, 1e5, 1e7}) {
        const Algorithm a = choose(n, b, k, 1 << 30);
        double fastest = modelledSeconds(a, n, b, k);
        for (int i = 0; i < kNumAlgorithms; ++i)
          fastest = std::min(fastest, modelledSeconds(Algorithm(i), n, b, k));
        EXPECT_LE(modelledSeconds(a, n, b, k), (1 + kNearMargin) * fastest) << n << " " << b;
        for (int i = 0; i < kNumAlgorithms; ++i) {
          if (modelledSeconds(Algorithm(i), n, b, k) <= (1 + kNearMargin) * fastest) {
            EXPECT_LE(busiestBytes(a, n, b), busiestBytes(Algorithm(i), n, b)) << n << " " << b << " " << i;
          }
        }
      }
}

}  // namespace
}  // namespace lowrank::ucx
