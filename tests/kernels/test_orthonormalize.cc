// Orthonormalization: columns orthonormal, span preserved, no NaN on zero or dependent columns.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/host/orthonormalize.h"
#include "kernels/host/random.h"

using namespace lowrank::host;
using Mat = Eigen::MatrixXd;

namespace {

Mat fromRowMajor(const std::vector<float>& a, size_t n, int k) {
  Mat m(n, k);
  for (size_t r = 0; r < n; ++r)
    for (int j = 0; j < k; ++j) m(r, j) = a[r * k + j];
  return m;
}

class Ortho : public ::testing::TestWithParam<std::pair<size_t, int>> {};

TEST_P(Ortho, OrthonormalAndSpanPreserved) {
  auto [n, k] = GetParam();
  std::vector<float> a(n * k);
  fillNormal(a.data(), a.size(), 5, n * 100 + k);
  const Mat A = fromRowMajor(a, n, k);
  orthonormalize(a.data(), n, k, k, 1, 0.0);
  const Mat Q = fromRowMajor(a, n, k);
  EXPECT_LE((Q.transpose() * Q - Mat::Identity(k, k)).norm(), 1e-5);
  // Span: A has no component outside span(Q).
  EXPECT_LE((A - Q * (Q.transpose() * A)).norm(), 1e-5 * A.norm());
}

INSTANTIATE_TEST_SUITE_P(Sizes, Ortho,
                         ::testing::Values(std::pair<size_t, int>{1, 1}, std::pair<size_t, int>{5, 1},
                                           std::pair<size_t, int>{2, 2}, std::pair<size_t, int>{100, 2},
                                           std::pair<size_t, int>{3, 3}, std::pair<size_t, int>{100, 4},
                                           std::pair<size_t, int>{1000, 8}, std::pair<size_t, int>{64, 16},
                                           std::pair<size_t, int>{16, 16}, std::pair<size_t, int>{300, 7},
                                           std::pair<size_t, int>{40, 13}));

TEST(Ortho, StridedColumnsOfTransposedStorage) {
  // Qt storage (k x m, row-major): element (r, j) at j*m + r.
  const size_t m = 50;
  const int k = 4;
  std::vector<float> qt(k * m);
  fillNormal(qt.data(), qt.size(), 9, 1);
  orthonormalize(qt.data(), m, k, 1, m, 0.0);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) {
      double d = 0;
      for (size_t r = 0; r < m; ++r) d += double(qt[i * m + r]) * qt[j * m + r];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-5);
    }
}

class Degenerate : public ::testing::TestWithParam<int> {};

TEST_P(Degenerate, ZeroAndDependentColumnsNeverNaN) {
  const int k = GetParam();
  const size_t n = 30;
  for (int mode = 0; mode < 3; ++mode) {  // all zero; one zero column; all columns equal
    std::vector<float> a(n * k);
    fillNormal(a.data(), a.size(), 3, mode);
    for (size_t r = 0; r < n; ++r)
      for (int j = 0; j < k; ++j) {
        if (mode == 0) a[r * k + j] = 0;
        if (mode == 1 && j == k - 1) a[r * k + j] = 0;
        if (mode == 2) a[r * k + j] = a[r * k];
      }
    const Mat A = fromRowMajor(a, n, k);
    orthonormalize(a.data(), n, k, k, 1, 0.0);
    const Mat Q = fromRowMajor(a, n, k);
    ASSERT_TRUE(Q.allFinite()) << "mode " << mode;
    // Every nonzero column has unit norm; nonzero columns are orthogonal; span(A) within span(Q).
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) {
        double d = Q.col(i).dot(Q.col(j));
        if (i == j) EXPECT_TRUE(std::abs(d - 1) < 1e-5 || std::abs(d) < 1e-12) << d;
        else EXPECT_NEAR(d, 0.0, 1e-5);
      }
    EXPECT_LE((A - Q * (Q.transpose() * A)).norm(), 1e-5 * (A.norm() + 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Degenerate, ::testing::Values(1, 2, 3, 4, 5, 8, 13));

TEST(Ortho, EpsilonScalesAsPyTorch) {
  // Gram-Schmidt divides by (norm + eps), as PyTorch's orthogonalization_epsilon.
  std::vector<float> a = {3, 4};  // one column of norm 5
  orthonormalize(a.data(), 2, 1, 1, 1, 5.0);
  EXPECT_FLOAT_EQ(a[0], 0.3f);
  EXPECT_FLOAT_EQ(a[1], 0.4f);
}

TEST(Random, DeterministicStandardNormal) {
  std::vector<float> a(100001), b(100001);
  fillNormal(a.data(), a.size(), 42, 7);
  fillNormal(b.data(), b.size(), 42, 7);
  EXPECT_EQ(a, b);
  fillNormal(b.data(), b.size(), 42, 8);
  EXPECT_NE(a, b);
  double mean = 0, var = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) var += (x - mean) * (x - mean);
  var /= a.size();
  EXPECT_NEAR(mean, 0, 0.02);
  EXPECT_NEAR(var, 1, 0.02);
}

}  // namespace
