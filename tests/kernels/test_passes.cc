// The three fused passes against naive Eigen references, for every dtype, padded views included.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <vector>

#include "util/convert.h"
#include "kernels/host/powersgd_kernels.h"

using namespace lowrank::host;
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

struct Case {
  size_t n, m, valid;
  int k;
  lowrankDataType_t dtype;
};

std::vector<float> randomVec(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

// G stored in the case's dtype; gf = its values as float (after rounding to the dtype).
struct Gradient {
  std::vector<uint8_t> bytes;
  std::vector<float> gf;
};

Gradient makeGradient(size_t count, lowrankDataType_t dt, unsigned seed) {
  Gradient g;
  std::vector<float> v = randomVec(count, seed);
  const size_t es = dt == lowrankFloat32 ? 4 : 2;
  g.bytes.resize(count * es);
  fromFloat32(v.data(), count, 1.f, g.bytes.data(), dt);
  g.gf.resize(count);
  toFloat32(g.bytes.data(), dt, count, g.gf.data());
  return g;
}

// The matrix M (n x m) of a flat buffer, zeros beyond `valid`.
Mat asMatrix(const std::vector<float>& x, const Case& c) {
  Mat a = Mat::Zero(c.n, c.m);
  for (size_t i = 0; i < c.valid; ++i) a(i / c.m, i % c.m) = x[i];
  return a;
}

double tol(const Case& c) { return c.dtype == lowrankFloat32 ? 1e-4 : 1e-2; }

class Passes : public ::testing::TestWithParam<Case> {};

TEST_P(Passes, MatchNaiveReference) {
  const Case c = GetParam();
  const MatrixView v{c.n, c.m, c.valid};
  Gradient g = makeGradient(c.valid, c.dtype, 11);
  std::vector<float> e0 = randomVec(c.valid, 12), qt = randomVec(size_t(c.k) * c.m, 13);
  for (float& x : e0) x *= 0.1f;

  // Pass 1 with error feedback: e becomes G + E, P = M Q.
  std::vector<float> e = e0, p(c.n * c.k, -1.f);
  EXPECT_EQ(errorFeedbackAndP(g.bytes.data(), c.dtype, e.data(), v, qt.data(), c.k, p.data()), 0u);
  for (size_t i = 0; i < c.valid; ++i) ASSERT_FLOAT_EQ(e[i], g.gf[i] + e0[i]) << i;
  std::vector<float> mflat(c.valid);
  for (size_t i = 0; i < c.valid; ++i) mflat[i] = g.gf[i] + e0[i];
  const Mat M = asMatrix(mflat, c);
  Mat Qt(c.k, c.m);
  for (int j = 0; j < c.k; ++j)
    for (size_t col = 0; col < c.m; ++col) Qt(j, col) = qt[j * c.m + col];
  const Mat Pref = M * Qt.transpose();
  Mat P = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
              p.data(), c.n, c.k).cast<double>();
  EXPECT_LE((P - Pref).norm(), 1e-5 * Pref.norm() + 1e-6);

  // Pass 1 without error feedback reads G only.
  std::vector<float> p2(c.n * c.k);
  errorFeedbackAndP(g.bytes.data(), c.dtype, nullptr, v, qt.data(), c.k, p2.data());
  const Mat P2ref = asMatrix(g.gf, c) * Qt.transpose();
  Mat P2 = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
               p2.data(), c.n, c.k).cast<double>();
  EXPECT_LE((P2 - P2ref).norm(), 1e-5 * P2ref.norm() + 1e-6);

  // Pass 2: Q = M^T P, with M = e.
  std::vector<float> q(size_t(c.k) * c.m, 7.f);
  computeQ(g.bytes.data(), c.dtype, e.data(), v, p.data(), c.k, q.data());
  const Mat Qref = (M.transpose() * P).transpose();  // k x m
  Mat Q = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
              q.data(), c.k, c.m).cast<double>();
  EXPECT_LE((Q - Qref).norm(), 1e-5 * Qref.norm() + 1e-6);

  // Pass 3: out = s P Qbar^T, e = M - P Qbar^T; nothing beyond `valid` is touched.
  const float s = 3.f;
  const size_t es = c.dtype == lowrankFloat32 ? 4 : 2;
  std::vector<uint8_t> out((c.valid + 8) * es, 0xab);
  decompressAndUpdateError(e.data(), v, p.data(), q.data(), c.k, s, out.data(), c.dtype);
  for (size_t i = c.valid * es; i < out.size(); ++i) ASSERT_EQ(out[i], 0xab) << "wrote past the end";
  std::vector<float> of(c.valid);
  toFloat32(out.data(), c.dtype, c.valid, of.data());
  const Mat A = P * Q;  // P Qbar^T with Qbar^T = Q (k x m)
  double errOut = 0, refOut = 0, errE = 0, refE = 0;
  for (size_t i = 0; i < c.valid; ++i) {
    const double a = A(i / c.m, i % c.m);
    errOut += std::pow(of[i] - s * a, 2);
    refOut += std::pow(s * a, 2);
    errE += std::pow(e[i] - (mflat[i] - a), 2);
    refE += std::pow(mflat[i] - a, 2);
  }
  EXPECT_LE(std::sqrt(errOut), tol(c) * std::sqrt(refOut) + 1e-6);
  EXPECT_LE(std::sqrt(errE), 1e-4 * std::sqrt(refE) + 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Passes,
    ::testing::Values(Case{1, 1, 1, 1, lowrankFloat32}, Case{7, 5, 35, 2, lowrankFloat32},
                      Case{33, 65, 33 * 65, 4, lowrankFloat32}, Case{64, 128, 64 * 128, 8, lowrankFloat32},
                      Case{32, 32, 1009, 4, lowrankFloat32},  // padded square (1009 is prime)
                      Case{1, 300, 300, 1, lowrankFloat32},   // one row
                      Case{300, 1, 300, 1, lowrankFloat32},   // one column
                      Case{40, 50, 2000, 4, lowrankFloat16}, Case{40, 50, 1990, 3, lowrankFloat16},
                      Case{40, 50, 2000, 4, lowrankBfloat16}, Case{17, 19, 300, 5, lowrankBfloat16}));

TEST(Passes, CountNonFiniteInEveryDtype) {
  for (lowrankDataType_t dt : {lowrankFloat32, lowrankFloat16, lowrankBfloat16}) {
    std::vector<float> x(100, 1.f);
    x[3] = NAN;
    x[50] = INFINITY;
    x[99] = -INFINITY;
    std::vector<uint8_t> b(100 * 4);
    fromFloat32(x.data(), 100, 1.f, b.data(), dt);
    EXPECT_EQ(countNonFinite(b.data(), 100, dt), 3u) << dt;
    MatrixView v{10, 10, 100};
    std::vector<float> qt(10, 1.f), p(10), e(100, 0.f);
    EXPECT_EQ(errorFeedbackAndP(b.data(), dt, e.data(), v, qt.data(), 1, p.data()), 3u) << dt;
    EXPECT_EQ(errorFeedbackAndP(b.data(), dt, nullptr, v, qt.data(), 1, p.data()), 3u) << dt;
  }
}

TEST(Passes, InPlaceDecompressOverwritesInput) {
  // out aliases g: pass 3 may write where the gradient was (error feedback holds M).
  Case c{8, 8, 64, 2, lowrankFloat32};
  MatrixView v{8, 8, 64};
  std::vector<float> g = randomVec(64, 3), e(64, 0.f), qt = randomVec(16, 4), p(16), q(16);
  errorFeedbackAndP(g.data(), c.dtype, e.data(), v, qt.data(), 2, p.data());
  computeQ(g.data(), c.dtype, e.data(), v, p.data(), 2, q.data());
  std::vector<float> outSeparate(64);
  std::vector<float> e2 = e;
  decompressAndUpdateError(e.data(), v, p.data(), q.data(), 2, 1.f, outSeparate.data(), c.dtype);
  decompressAndUpdateError(e2.data(), v, p.data(), q.data(), 2, 1.f, g.data(), c.dtype);
  EXPECT_EQ(outSeparate, g);
  EXPECT_EQ(e, e2);
}

}  // namespace

namespace {

// Pass 2 and 3 by column blocks (ld = full width, each block's Qt contiguous) give the same bits
// as over the whole matrix: the pipelined schedule relies on it.
TEST(Passes, ColumnBlocksEqualTheWholeMatrix) {
  for (size_t valid : {size_t(37 * 53), size_t(37 * 53 - 20)}) {  // full, and padded
    const size_t n = 37, m = 53;
    const int k = 3;
    const MatrixView whole{n, m, valid};
    std::vector<float> g = randomVec(valid, 21), e0 = randomVec(valid, 22), p = randomVec(n * k, 23);
    std::vector<float> qWhole(k * m), qBlocks(k * m);
    computeQ(g.data(), lowrankFloat32, e0.data(), whole, p.data(), k, qWhole.data());
    const size_t cuts[] = {0, 1, 17, 40, 53};  // blocks of width 1, 16, 23, 13
    for (int b = 0; b + 1 < 5; ++b) {
      const size_t c0 = cuts[b], w = cuts[b + 1] - c0;
      const MatrixView blk{n, w, valid - c0, m};
      computeQ(g.data() + c0, lowrankFloat32, e0.data() + c0, blk, p.data(), k, qBlocks.data() + k * c0);
      for (int j = 0; j < k; ++j)
        for (size_t c = 0; c < w; ++c)
          ASSERT_EQ(qBlocks[k * c0 + j * w + c], qWhole[j * m + c0 + c]) << "block " << b;
    }
    std::vector<float> eW = e0, eB = e0, oW(valid), oB(valid, -7.f);
    decompressAndUpdateError(eW.data(), whole, p.data(), qWhole.data(), k, 2.f, oW.data(), lowrankFloat32);
    for (int b = 0; b + 1 < 5; ++b) {
      const size_t c0 = cuts[b], w = cuts[b + 1] - c0;
      const MatrixView blk{n, w, valid - c0, m};
      decompressAndUpdateError(eB.data() + c0, blk, p.data(), qBlocks.data() + k * c0, k, 2.f,
                               oB.data() + c0, lowrankFloat32);
    }
    EXPECT_EQ(oW, oB);
    EXPECT_EQ(eW, eB);
  }
}

}  // namespace

namespace {

// The alternating steps (ACP-SGD) against the naive reference: P step M = G + E, P = M Q,
// E = M - P Q^T; Q step Q = M^T P, E = M - P Q^T; without E, M = G and nothing is kept.
class AlternateSteps : public ::testing::TestWithParam<Case> {};

Mat fromRows(const float* x, size_t rows, size_t cols) {
  return Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
             x, rows, cols).cast<double>();
}

TEST_P(AlternateSteps, MatchNaiveReference) {
  const Case c = GetParam();
  const MatrixView v{c.n, c.m, c.valid};
  Gradient g = makeGradient(c.valid, c.dtype, 31);
  std::vector<float> e0 = randomVec(c.valid, 32);
  for (float& x : e0) x *= 0.1f;
  std::vector<float> mflat(c.valid);
  for (size_t i = 0; i < c.valid; ++i) mflat[i] = g.gf[i] + e0[i];
  const Mat M = asMatrix(mflat, c), G = asMatrix(g.gf, c);
  const std::vector<float> qt = randomVec(size_t(c.k) * c.m, 33), pk = randomVec(c.n * c.k, 34);
  const Mat Qt = fromRows(qt.data(), c.k, c.m), Pk = fromRows(pk.data(), c.n, c.k);
  auto residualOk = [&](const std::vector<float>& e, const Mat& R) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < c.valid; ++i) {
      err += std::pow(e[i] - R(i / c.m, i % c.m), 2);
      ref += std::pow(R(i / c.m, i % c.m), 2);
    }
    return std::sqrt(err) <= 1e-4 * std::sqrt(ref) + 1e-4;
  };

  // P step.
  std::vector<float> e = e0, p(c.n * c.k, -1.f);
  EXPECT_EQ(alternateStepP(g.bytes.data(), c.dtype, e.data(), v, qt.data(), c.k, p.data()), 0u);
  const Mat P = fromRows(p.data(), c.n, c.k), Pref = M * Qt.transpose();
  EXPECT_LE((P - Pref).norm(), 1e-5 * Pref.norm() + 1e-6);
  EXPECT_TRUE(residualOk(e, M - Pref * Qt)) << "P step residual";
  std::vector<float> p0(c.n * c.k);  // without E: P = G Q
  alternateStepP(g.bytes.data(), c.dtype, nullptr, v, qt.data(), c.k, p0.data());
  const Mat P0ref = G * Qt.transpose();
  EXPECT_LE((fromRows(p0.data(), c.n, c.k) - P0ref).norm(), 1e-5 * P0ref.norm() + 1e-6);

  // Q step.
  e = e0;
  std::vector<float> q(size_t(c.k) * c.m, 7.f);
  EXPECT_EQ(alternateStepQ(g.bytes.data(), c.dtype, e.data(), v, pk.data(), c.k, q.data()), 0u);
  const Mat Q = fromRows(q.data(), c.k, c.m), Qref = Pk.transpose() * M;  // k x m
  EXPECT_LE((Q - Qref).norm(), 1e-5 * Qref.norm() + 1e-6);
  EXPECT_TRUE(residualOk(e, M - Pk * Qref)) << "Q step residual";
  std::vector<float> q0(size_t(c.k) * c.m);
  alternateStepQ(g.bytes.data(), c.dtype, nullptr, v, pk.data(), c.k, q0.data());
  const Mat Q0ref = Pk.transpose() * G;
  EXPECT_LE((fromRows(q0.data(), c.k, c.m) - Q0ref).norm(), 1e-5 * Q0ref.norm() + 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AlternateSteps,
    ::testing::Values(Case{1, 1, 1, 1, lowrankFloat32}, Case{7, 5, 35, 2, lowrankFloat32},
                      Case{33, 65, 33 * 65, 4, lowrankFloat32},
                      Case{300, 200, 300 * 200, 4, lowrankFloat32},
                      Case{2048, 130, 2048 * 130, 2, lowrankFloat32},  // several row tiles
                      Case{32, 32, 1009, 4, lowrankFloat32},  // padded square
                      Case{1, 300, 300, 1, lowrankFloat32}, Case{300, 1, 300, 1, lowrankFloat32},
                      Case{40, 50, 1990, 3, lowrankFloat16}, Case{17, 19, 300, 5, lowrankBfloat16}));

// The tiles of the fused steps change nothing: the factor has the bits of one untiled sweep (the
// P step's own dot products; the Q step's are pass 2's), over the whole matrix and by the
// schedule's column blocks alike.
TEST(AlternateSteps, TilesGiveTheBitsOfTheUnfusedPasses) {
  // 3000 x 200: five row tiles of the P step (512 KiB each); the Q step sweeps the whole matrix
  // twice (until the seventh session it took column tiles: this test held those too).
  for (size_t valid : {size_t(3000 * 200), size_t(3000 * 200 - 123)}) {
    const size_t n = 3000, m = 200;
    const int k = 4;
    const MatrixView v{n, m, valid};
    const std::vector<float> g = randomVec(valid, 41), e0 = randomVec(valid, 42);
    const std::vector<float> qt = randomVec(size_t(k) * m, 43), pk = randomVec(n * k, 44);
    std::vector<float> e1 = e0, e2 = e0, p1(n * k), p2(n * k);
    alternateStepP(g.data(), lowrankFloat32, e1.data(), v, qt.data(), k, p1.data());
    // Untiled: without E the P step is one sweep over M = G + E, summed as the fused one does.
    std::vector<float> msum(valid);
    for (size_t i = 0; i < valid; ++i) msum[i] = g[i] + e0[i];
    alternateStepP(msum.data(), lowrankFloat32, nullptr, v, qt.data(), k, p2.data());
    EXPECT_EQ(p1, p2);
    std::vector<float> q1(size_t(k) * m), q2(size_t(k) * m);
    e1 = e0;
    e2 = e0;
    alternateStepQ(g.data(), lowrankFloat32, e1.data(), v, pk.data(), k, q1.data());
    errorFeedbackAndP(g.data(), lowrankFloat32, e2.data(), v, qt.data(), k, p2.data());  // e2 = M
    computeQ(g.data(), lowrankFloat32, e2.data(), v, pk.data(), k, q2.data());
    EXPECT_EQ(q1, q2);
    // By column blocks of the schedule (ld = m): the same bits again.
    std::vector<float> e3 = e0, q3(size_t(k) * m);
    const size_t cuts[] = {0, 100, 200};
    for (int b = 0; b < 2; ++b) {
      const size_t c0 = cuts[b], w = cuts[b + 1] - c0;
      std::vector<float> blk(size_t(k) * w);
      alternateStepQ(g.data() + c0, lowrankFloat32, e3.data() + c0, MatrixView{n, w, valid - c0, m},
                     pk.data(), k, blk.data());
      for (int j = 0; j < k; ++j)
        for (size_t c = 0; c < w; ++c) q3[j * m + c0 + c] = blk[j * w + c];
    }
    EXPECT_EQ(q3, q1);
    EXPECT_EQ(e3, e1);
  }
}

// A Q step that leaves its residual to the next P step (deferResidual, then pendingQt) gives that
// P step the bits of the eager sequence: the same factor, the same residual after it, the same E
// as subtractLowRank reads it in between; over several row tiles, by the schedule's column blocks
// (the own Q gathered into the tensor's layout), padded, with 16-bit factors, in each
// instruction set.
// The P step after a deferred Q step runs its own fused sweep (pRowsAfterQ: 4 rows at once in
// 8-float lanes, for k <= 8) or the row-by-row one (k > 8). Both must give the eager schedule's
// bits: m = 203 leaves 3 columns past the lanes in every row, a short last row or an empty one
// ends a padded view, G comes in every dtype and the limit counts elements.
TEST(AlternateSteps, DeferredResidualGivesTheBitsOfTheEagerOne) {
  const size_t n = 1501, m = 203;
  const float limit = 2.5f;  // about 1% of M's elements beyond: counted on both paths
  const HostIsa before = hostIsa();
  for (HostIsa isa : {HostIsa::baseline, HostIsa::avx2}) {
    if (!hostIsaSupported(isa)) continue;
    ASSERT_TRUE(setHostIsa(isa).ok());
    for (lowrankDataType_t wire : {lowrankFloat32, lowrankBfloat16})
      for (lowrankDataType_t gdt : {lowrankFloat32, lowrankFloat16, lowrankBfloat16})
        // (n - 1) m: the last row all padding after whole blocks of 4 (its P must come out 0,
        // whatever the last step left there).
        for (size_t valid : {n * m, n * m - 123, (n - 1) * m})
          for (int k : {1, 3, 4, 8, 11}) {
            SCOPED_TRACE(::testing::Message() << hostIsaName(isa) << " wire " << int(wire)
                                              << " g " << int(gdt) << " valid " << valid
                                              << " k " << k);
            const MatrixView v{n, m, valid};
            const std::vector<float> g1 = randomVec(valid, 51), e0 = randomVec(valid, 53),
                                     qt = randomVec(size_t(k) * m, 54),
                                     pk = randomVec(n * size_t(k), 55);
            const Gradient g2 = makeGradient(valid, gdt, 52);
            // Eager: the Q step's own residual sweep, then the P step.
            std::vector<float> eE = e0, qE(size_t(k) * m), pE = pk;
            alternateStepQ(g1.data(), lowrankFloat32, eE.data(), v, pk.data(), k, qE.data(),
                           INFINITY, wire);
            const std::vector<float> afterQ = eE;
            const size_t badE = alternateStepP(g2.bytes.data(), gdt, eE.data(), v, qt.data(), k,
                                               pE.data(), limit, wire);
            // Deferred, the Q step by two column blocks as the schedule takes them.
            std::vector<float> eD = e0, qD(size_t(k) * m), pD = pk;
            const size_t cuts[] = {0, 120, m};
            for (int b = 0; b < 2; ++b) {
              const size_t c0 = cuts[b], w = cuts[b + 1] - c0;
              std::vector<float> blk(size_t(k) * w);
              alternateStepQ(g1.data() + c0, lowrankFloat32, eD.data() + c0,
                             MatrixView{n, w, valid - c0, m}, pk.data(), k, blk.data(), INFINITY,
                             wire, /*deferResidual=*/true);
              for (int j = 0; j < k; ++j)
                for (size_t c = 0; c < w; ++c) qD[j * m + c0 + c] = blk[j * w + c];
            }
            EXPECT_EQ(qD, qE) << "the Q step's factor";
            std::vector<float> read = eD;  // a reader in between (HostBackend::save)
            subtractLowRank(read.data(), v, pD.data(), qD.data(), m, k);
            EXPECT_EQ(read, afterQ) << "E as read between the steps";
            EXPECT_NE(eD, afterQ) << "the residual was left to the P step";
            const size_t badD = alternateStepP(g2.bytes.data(), gdt, eD.data(), v, qt.data(), k,
                                               pD.data(), limit, wire, qD.data());
            EXPECT_GT(badE, valid / 1000) << "the limit counts some elements";
            EXPECT_EQ(badD, badE) << "elements beyond the limit";
            EXPECT_EQ(pD, pE) << "the P step's factor";
            EXPECT_EQ(eD, eE) << "the P step's residual";
          }
  }
  ASSERT_TRUE(setHostIsa(before).ok());
}

TEST(AlternateSteps, CountNonFiniteAndHugeInputs) {
  std::vector<float> g(100, 1.f), qt(10, 1.f), p(10, 1.f), e(100, 0.f), out(10);
  g[7] = NAN;
  g[42] = 1e30f;
  MatrixView v{10, 10, 100};
  EXPECT_EQ(alternateStepP(g.data(), lowrankFloat32, e.data(), v, qt.data(), 1, out.data(), 1e20f), 2u);
  std::fill(e.begin(), e.end(), 0.f);
  EXPECT_EQ(alternateStepQ(g.data(), lowrankFloat32, e.data(), v, p.data(), 1, out.data(), 1e20f), 2u);
  EXPECT_EQ(alternateStepQ(g.data(), lowrankFloat32, nullptr, v, p.data(), 1, out.data(), 1e20f), 2u);
}

}  // namespace
