// Plans: the batched view, the compression test, per-tensor layouts.
#include <gtest/gtest.h>

#include "engine/plan.h"

using namespace lowrank;

TEST(BatchedView, NearSquareFactorisationOrPaddedSquare) {
  struct { size_t count, rows, cols; } cases[] = {
      {1, 1, 1},     {1024, 32, 32},  {2048, 32, 64}, {1000, 25, 40},
      {4096 * 4, 128, 128}, {12, 3, 4}, {20, 4, 5},
      {1009, 32, 32},  // prime: padded square
      {2018, 45, 45},  // 2 x 1009 has aspect 504: padded
      {3 * 100, 15, 20}};
  for (auto c : cases) {
    host::MatrixView v = batchedView(c.count);
    EXPECT_EQ(v.rows, c.rows) << c.count;
    EXPECT_EQ(v.cols, c.cols) << c.count;
    EXPECT_EQ(v.valid, c.count);
    EXPECT_GE(v.rows * v.cols, c.count);
    EXPECT_LE(v.cols, 4 * v.rows);
  }
}

TEST(ShouldCompress, PyTorchsRule) {
  // (n + m) k rate < n m
  EXPECT_TRUE(shouldCompress(64, 288, 4, 2));   // 2816 < 18432
  EXPECT_FALSE(shouldCompress(32, 9, 4, 2));    // 328 >= 288
  EXPECT_FALSE(shouldCompress(16, 16, 4, 2));   // 256 == 256: not strictly less
  EXPECT_TRUE(shouldCompress(16, 16, 4, 1.9));
  EXPECT_FALSE(shouldCompress(100, 100, 0, 2));
}

TEST(MakePlan, DigitsCnnLayoutGivesTheReferenceRatio) {
  // The shapes of perf/data/digits_cnn (767,818 parameters in 18 tensors).
  Layout l = {{32, 1, 3, 3}, {32}, {32}, {32}, {64, 32, 3, 3}, {64}, {64}, {64}, {128, 64, 3, 3},
              {128}, {128}, {128}, {128, 128, 3, 3}, {128}, {256, 2048}, {256}, {10, 256}, {10}};
  EngineConfig cfg;
  Plan p;
  ASSERT_TRUE(makePlan(767818, lowrankFloat32, lowrankSum, &l, cfg, &p).ok());
  EXPECT_TRUE(p.perTensor);
  EXPECT_EQ(p.tensors.size(), 18u);
  int compressed = 0;
  for (auto& t : p.tensors) compressed += t.compressed;
  EXPECT_EQ(compressed, 5);  // c1 (32 x 9) fails the rate test; the 4-D and 2-D others pass
  const double ratio = 767818.0 / double(p.pElems + p.qElems + p.exactElems);
  EXPECT_NEAR(ratio, 36.6, 0.05);
  EXPECT_EQ(p.tensors[4].view.rows, 64u);
  EXPECT_EQ(p.tensors[4].view.cols, 288u);
}

TEST(MakePlan, LayoutMustCoverTheCount) {
  Layout l = {{10, 10}, {5}};
  Plan p;
  Status s = makePlan(104, lowrankFloat32, lowrankSum, &l, EngineConfig{}, &p);
  EXPECT_EQ(s.code, lowrankInvalidUsage);
  EXPECT_NE(s.msg.find("105"), std::string::npos);
}

TEST(MakePlan, RankClippedAndHashDiffers) {
  EngineConfig cfg;
  cfg.approxRank = 64;
  Layout l = {{4, 1000}};
  Plan p;
  ASSERT_TRUE(makePlan(4000, lowrankFloat32, lowrankSum, &l, cfg, &p).ok());
  EXPECT_EQ(p.tensors[0].k, 4);  // clipped to min(n, m); then (n + m) 4 2 > n m: exact
  EXPECT_FALSE(p.tensors[0].compressed);
  Plan a, b, c;
  ASSERT_TRUE(makePlan(4096, lowrankFloat32, lowrankSum, nullptr, EngineConfig{}, &a).ok());
  ASSERT_TRUE(makePlan(4096, lowrankFloat32, lowrankAvg, nullptr, EngineConfig{}, &b).ok());
  ASSERT_TRUE(makePlan(4097, lowrankFloat32, lowrankSum, nullptr, EngineConfig{}, &c).ok());
  EXPECT_EQ(a.hash, b.hash);  // sum and avg share a plan
  EXPECT_NE(a.hash, c.hash);
}
