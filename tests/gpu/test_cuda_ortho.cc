// orthonormalize against host::orthonormalize: both layouts, Gram-Schmidt and Householder sizes,
// zero and dependent columns, the one-block, multi-block (CholeskyQR2) and dense-QR (cuSOLVER)
// paths.
#include <cstdlib>
#include <fstream>
#include <string>

#include <cuda_runtime.h>  // __host__ __device__, for the tables' header

#include "kernels/cuda/dense_qr.h"
#include "kernels/cuda/tables.cuh"
#include "tests/gpu/kernel_test_support.h"

namespace lowrank::gputest {
namespace {

struct OrthoMat {
  uint64_t n;
  uint32_t k;
  bool transposed;        // Qt layout (rowStride 1, colStride n) instead of P's (k, 1)
  int zeroCol = -1;       // this column all zero
  int dependentCol = -1;  // this column = 2 * column 0 (k <= 2) or column 0 + column 1
  bool allZero = false;
  int zeroRows = 0;       // the first rows all zero (an embedding's unused tokens)
};

class Orthonormalize : public ::testing::TestWithParam<double> {};

// One table of matrices of both layouts, Gram-Schmidt and Householder sizes, zero and dependent
// columns. eps 0 makes the dependent-column rule decide alone (eps would hide it).
TEST_P(Orthonormalize, MatchesHostTwinOnOneTable) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<OrthoMat> mats = {
      {1, 1, false},
      {5, 1, true},
      {100, 2, false},
      {2, 2, true},
      {3, 3, false},
      {100, 4, true},
      {1000, 8, false},
      {64, 16, true},
      {16, 16, false},
      {300, 32, false},
      {200, 40, true},
      {700, 3, true},
      {50, 1, false, 0},             // zero column (Gram-Schmidt)
      {50, 2, true, 1},              // zero second column (Gram-Schmidt)
      {60, 2, false, -1, 1},         // dependent: column 1 = 2 column 0 (Gram-Schmidt)
      {80, 4, false, 2},             // zero column (Householder)
      {80, 4, true, -1, 3},          // dependent last column (Householder)
      {40, 5, false, -1, -1, true},  // all zero (Householder)
      {40, 2, true, -1, -1, true},   // all zero (Gram-Schmidt)
      // The multi-block path (CholeskyQR2; n k >= 4096, k <= 32), and its fallback to the
      // one-block algorithm where it flags a matrix (zero, dependent or all-zero columns).
      {4096, 1, false},
      {2500, 2, true},
      {3000, 3, false},
      {1100, 4, true},
      {600, 7, false},
      {520, 8, true},
      {257, 16, false},
      {700, 32, true},
      {129, 32, false},
      {2048, 2, false, -1, 1},         // dependent (Gram-Schmidt): flagged
      {2048, 1, true, 0},              // zero column: flagged
      {1500, 4, false, 1},             // zero column (Householder): flagged
      {1200, 5, true, -1, 4},          // dependent (Householder): flagged
      {300, 16, false, -1, -1, true},  // all zero: flagged
      // The dense-QR path (cuSOLVER where it loads; k > 32, n k >= 4096), full rank and not.
      {1000, 48, false},
      {130, 33, true},
      {64, 64, false},
      {500, 40, true, 7},         // zero column
      {400, 36, false, -1, 35},   // dependent last column
      {100, 41, true, -1, -1, true},  // all zero
      {1000, 48, true, -1, -1, false, 3},  // zero leading rows: full rank, the host's signs
      {1024, 8, false, -1, -1, false, 2},  // the same on the CholeskyQR2 path
  };
  std::vector<cu::OrthoDesc> descs;
  uint64_t total = 3;
  for (const OrthoMat& m : mats) {
    cu::OrthoDesc d;
    d.offset = total;
    d.n = m.n;
    d.k = m.k;
    d.rowStride = m.transposed ? 1 : m.k;
    d.colStride = m.transposed ? m.n : 1;
    descs.push_back(d);
    total += m.n * m.k + 5;  // gaps between the matrices
  }
  std::vector<float> a = normal(total, 13);
  auto at = [&](size_t mi, uint64_t r, uint32_t j) -> float& {
    const cu::OrthoDesc& d = descs[mi];
    return a[d.offset + r * d.rowStride + j * d.colStride];
  };
  for (size_t mi = 0; mi < mats.size(); ++mi) {
    const OrthoMat& m = mats[mi];
    for (uint64_t r = 0; r < m.n; ++r) {
      if (m.allZero || r < uint64_t(m.zeroRows))
        for (uint32_t j = 0; j < m.k; ++j) at(mi, r, j) = 0.f;
      if (m.zeroCol >= 0) at(mi, r, m.zeroCol) = 0.f;
      if (m.dependentCol >= 0)
        at(mi, r, m.dependentCol) = m.k <= 2 ? 2.f * at(mi, r, 0) : at(mi, r, 0) + at(mi, r, 1);
    }
  }
  const double eps = GetParam();
  std::vector<float> h = a;
  for (const cu::OrthoDesc& d : descs)
    host::orthonormalize(h.data() + d.offset, d.n, int(d.k), d.rowStride, d.colStride, eps);

  DeviceArray<float> da(a);
  cu::OrthoTable* tbl = nullptr;
  CUDA_OK(cu::createOrthoTable(descs.data(), descs.size(), &tbl));
  // Every matrix for cuSOLVER takes that path where it loads (else the one-block kernel).
  size_t denseExpected = 0;
  for (const cu::OrthoDesc& d : descs) denseExpected += cu::detail::denseQrOrtho(d);
  EXPECT_EQ(tbl->denseHost.size(), cu::detail::denseQrApi() ? denseExpected : 0);
  CUDA_OK(cu::orthonormalize(tbl, da.get(), eps, nullptr));
  const std::vector<float> dv = da.download();
  cu::destroy(tbl);

  // Outside the matrices: untouched.
  std::vector<char> inside(total, 0);
  for (const cu::OrthoDesc& d : descs)
    for (uint64_t r = 0; r < d.n; ++r)
      for (uint32_t j = 0; j < d.k; ++j) inside[d.offset + r * d.rowStride + j * d.colStride] = 1;
  for (uint64_t i = 0; i < total; ++i)
    if (!inside[i]) {
      EXPECT_TRUE(sameFloat(dv[i], a[i])) << "gap element " << i << " was written";
    }

  for (size_t mi = 0; mi < mats.size(); ++mi) {
    const OrthoMat& m = mats[mi];
    const cu::OrthoDesc& d = descs[mi];
    SCOPED_TRACE("matrix " + std::to_string(mi) + ": n " + std::to_string(m.n) + ", k " +
                 std::to_string(m.k) + (m.transposed ? ", Qt layout" : ", P layout"));
    auto dq = [&](uint64_t r, uint32_t j) {
      return dv[d.offset + r * d.rowStride + j * d.colStride];
    };
    auto hq = [&](uint64_t r, uint32_t j) {
      return h[d.offset + r * d.rowStride + j * d.colStride];
    };
    // Householder on a dependent column: that column and the later ones are a completion of the
    // basis that rounding decides, so only the earlier ones are compared with the host.
    const uint32_t comparable = m.k > 2 && m.dependentCol >= 0 ? uint32_t(m.dependentCol) : m.k;
    // The dense-QR path gives a zero column's place the other sign than the host's (LAPACK
    // leaves it unreflected); P Q^T does not change with the columns' signs. Every other column
    // has the host's sign.
    const bool dense = m.k > 32 && m.n * m.k >= 4096;
    std::vector<float> sign(m.k, 1.f);
    for (uint32_t j = 0; j < m.k; ++j)
      if (dense && (m.allZero || int(j) == m.zeroCol)) {
        uint64_t big = 0;
        for (uint64_t r = 0; r < m.n; ++r)
          if (std::fabs(hq(r, j)) > std::fabs(hq(big, j))) big = r;
        sign[j] = (dq(big, j) < 0) == (hq(big, j) < 0) ? 1.f : -1.f;
      }
    int reported = 0;
    for (uint64_t r = 0; r < m.n; ++r)
      for (uint32_t j = 0; j < m.k; ++j) {
        ASSERT_TRUE(std::isfinite(dq(r, j))) << "row " << r << " col " << j;
        if (j < comparable && !(std::fabs(sign[j] * dq(r, j) - hq(r, j)) <= 2e-5) &&
            reported++ < 10)
          ADD_FAILURE() << "row " << r << " col " << j << ": device " << dq(r, j) << ", host "
                        << hq(r, j);
      }
    // Columns orthonormal (Gram-Schmidt's zeroed columns: zero).
    for (uint32_t i = 0; i < m.k; ++i)
      for (uint32_t j = 0; j <= i; ++j) {
        double dot = 0, hdot = 0;
        for (uint64_t r = 0; r < m.n; ++r) {
          dot += double(dq(r, i)) * dq(r, j);
          hdot += double(hq(r, i)) * hq(r, j);
        }
        const bool zeroed = m.k <= 2 && i == j && hdot < 0.5;  // the host zeroed it too
        EXPECT_NEAR(dot, i == j && !zeroed ? 1.0 : 0.0, 1e-5) << "columns " << i << ", " << j;
      }
  }
}

// cuSOLVER is found as documented (kernels/cuda/dense_qr.h): the library LOWRANK_CUSOLVER_LIBRARY
// names, and no other when it names none that loads.
TEST(DenseQr, LoadsTheLibraryTheEnvironmentNames) {
  const char* env = std::getenv("LOWRANK_CUSOLVER_LIBRARY");
  if (!env) GTEST_SKIP() << "LOWRANK_CUSOLVER_LIBRARY is not set (the emulated tests set it)";
  const char* why = nullptr;
  const cu::detail::DenseQrApi* api = cu::detail::denseQrApi(&why);
  if (std::ifstream(env).good()) {
    EXPECT_NE(api, nullptr) << why;
  } else {
    EXPECT_EQ(api, nullptr);
    ASSERT_NE(why, nullptr);
    EXPECT_NE(std::string(why).find("LOWRANK_CUSOLVER_LIBRARY"), std::string::npos) << why;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Orthonormalize, ::testing::Values(0.0, 1e-8),
                         [](const ::testing::TestParamInfo<double>& i) {
                           return i.param == 0 ? std::string("eps0") : std::string("eps1e8");
                         });

}  // namespace
}  // namespace lowrank::gputest
