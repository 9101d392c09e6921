// The kernels' scratch lives as long as the call, not as long as the thread: a comm rank's thread
// that once compressed a very tall or very wide tensor must not keep scratch of that size after
// every buffer is released (found by the soak, tests/soak: ~190 MB held by 4 rank threads).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "kernels/host/random.h"
#include "support/memory.h"

using namespace lowrank::host;
using lowrank::testing::residentBytesTrimmed;

namespace {

constexpr size_t kMB = 1000 * 1000;

// P of a tall matrix: the scratch is a float64 copy, k * n doubles (128 MB here).
TEST(Scratch, OrthonormalizeKeepsNoneAfterTheCall) {
  const size_t n = size_t(1) << 22;
  const int k = 4;
  std::vector<float> p(n * k);
  fillNormal(p.data(), p.size(), 3, 1);
  const size_t before = residentBytesTrimmed();
  orthonormalize(p.data(), n, k, size_t(k), 1, 0.0);
  const size_t after = residentBytesTrimmed();
  EXPECT_LT(after, before + 16 * kMB) << "held " << (after - before) / kMB << " MB after the call";
}

// Decompression of a wide matrix (one row of 8 Mi columns): the scratch is one row of P Qbar^T,
// and float16 inputs without error feedback add kBlock rows of M in pass 1 and 2 (32 MB each).
TEST(Scratch, PassesKeepNoneAfterTheCall) {
  MatrixView v;
  v.rows = 4;
  v.cols = size_t(1) << 23;
  v.valid = v.rows * v.cols;
  const int k = 1;
  std::vector<uint16_t> g(v.valid, 0x3c00);  // float16 ones
  std::vector<float> e(v.valid, 0.f), qt(v.cols, 1.f), p(v.rows, 1.f);
  std::vector<uint16_t> out(v.valid);
  const size_t before = residentBytesTrimmed();
  errorFeedbackAndP(g.data(), lowrankFloat16, nullptr, v, qt.data(), k, p.data(), 1e30f);
  computeQ(g.data(), lowrankFloat16, nullptr, v, p.data(), k, qt.data());
  decompressAndUpdateError(e.data(), v, p.data(), qt.data(), k, 1.f, out.data(), lowrankFloat16);
  const size_t after = residentBytesTrimmed();
  EXPECT_LT(after, before + 16 * kMB) << "held " << (after - before) / kMB << " MB after the calls";
}

}  // namespace
