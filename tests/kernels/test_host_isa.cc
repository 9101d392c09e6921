// The host kernels give the same bits whichever instruction set runs their element-wise passes
// (powersgd_kernels.h, HostIsa): every public kernel, run under the baseline and under AVX2 on the
// same inputs, must write identical bytes. Skips where this CPU or build has no AVX2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/host/powersgd_kernels.h"
#include "support/env.h"

using namespace lowrank::host;

namespace {

std::vector<float> randomVec(size_t count, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(count);
  for (float& x : v) x = scale * d(rng);
  return v;
}

size_t bytesOf(lowrankDataType_t dt) { return dt == lowrankFloat32 ? 4 : 2; }

// Every output of every kernel on one case, as bytes, in a fixed order.
struct Outputs {
  std::vector<uint8_t> bytes;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  void add(const std::vector<float>& v) { add(v.data(), 4 * v.size()); }
};

// One shape: rows x cols in storage of row stride ld (ld > cols: a column block of a wider matrix),
// `valid` elements counted from the start (fewer: padded), rank k, G of dtype dt.
struct Shape {
  size_t rows, cols, ld, valid;
  int k;
  lowrankDataType_t dt;
  std::string name() const {
    return std::to_string(rows) + "x" + std::to_string(cols) + " ld " + std::to_string(ld) +
           " valid " + std::to_string(valid) + " k " + std::to_string(k) + " dtype " +
           std::to_string(int(dt));
  }
};

Outputs runAll(const Shape& s) {
  MatrixView v{s.rows, s.cols, s.valid, s.ld == s.cols ? 0 : s.ld};
  const size_t span = s.rows * s.ld, es = bytesOf(s.dt);
  std::vector<float> gf = randomVec(span, 11);
  std::vector<uint8_t> g(span * es);
  fromFloat32(gf.data(), span, 1.f, g.data(), s.dt);
  const std::vector<float> e0 = randomVec(span, 12, 0.25f);
  const std::vector<float> qt0 = randomVec(size_t(s.k) * s.cols, 13);
  const std::vector<float> p0 = randomVec(s.rows * size_t(s.k), 14);
  Outputs o;

  // PowerSGD's three passes, with E and without.
  for (bool withE : {true, false}) {
    std::vector<float> e = e0, p(s.rows * size_t(s.k)), qt(size_t(s.k) * s.cols);
    std::vector<uint8_t> out(span * es, 0);
    float* ep = withE ? e.data() : nullptr;
    o.bytes.push_back(uint8_t(errorFeedbackAndP(g.data(), s.dt, ep, v, qt0.data(), s.k, p.data())));
    computeQ(g.data(), s.dt, ep, v, p0.data(), s.k, qt.data());
    decompressAndUpdateError(ep, v, p0.data(), qt.data(), s.k, 3.f, out.data(), s.dt);
    o.add(p), o.add(qt), o.add(out.data(), out.size());
    if (withE) o.add(e);
  }
  // The alternating steps, float32 and bf16 on the wire, with E and without.
  for (lowrankDataType_t wire : {lowrankFloat32, lowrankBfloat16}) {
    for (bool withE : {true, false}) {
      std::vector<float> e = e0, p(s.rows * size_t(s.k)), qt(size_t(s.k) * s.cols);
      float* ep = withE ? e.data() : nullptr;
      const size_t badP = alternateStepP(g.data(), s.dt, ep, v, qt0.data(), s.k, p.data(), 2.f, wire);
      const size_t badQ = alternateStepQ(g.data(), s.dt, ep, v, p0.data(), s.k, qt.data(), 2.f, wire);
      o.add(&badP, sizeof badP), o.add(&badQ, sizeof badQ);
      o.add(p), o.add(qt);
      if (withE) o.add(e);
    }
  }
  return o;
}

TEST(HostIsa, ElementwisePassesGiveTheSameBitsWithEitherInstructionSet) {
  if (!hostIsaSupported(HostIsa::avx2))
    GTEST_SKIP() << "no AVX2 here (CPU or build): only the baseline runs, nothing to compare";
  const HostIsa before = hostIsa();
  std::vector<Shape> shapes;
  // k = 1..9 and 12 (the block paths of k <= 8 and the run-time k beyond), odd widths (vector
  // tails), a padded view, a column block (ld > cols), each input dtype.
  for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12})
    shapes.push_back({23, 37, 37, 23 * 37, k, lowrankFloat32});
  for (lowrankDataType_t dt : {lowrankFloat32, lowrankFloat16, lowrankBfloat16}) {
    shapes.push_back({64, 129, 129, 64 * 129, 4, dt});
    shapes.push_back({30, 41, 41, 29 * 41 + 17, 3, dt});  // padded: the last row partly there
    shapes.push_back({17, 24, 53, 17 * 53, 5, dt});       // a column block of a 53-wide matrix
  }
  shapes.push_back({9, 1031, 1031, 9 * 1031, 8, lowrankFloat32});
  for (const Shape& s : shapes) {
    ASSERT_TRUE(setHostIsa(HostIsa::baseline).ok());
    const Outputs base = runAll(s);
    ASSERT_TRUE(setHostIsa(HostIsa::avx2).ok());
    ASSERT_EQ(hostIsa(), HostIsa::avx2);
    const Outputs avx = runAll(s);
    ASSERT_EQ(base.bytes.size(), avx.bytes.size()) << s.name();
    size_t first = 0;
    while (first < base.bytes.size() && base.bytes[first] == avx.bytes[first]) ++first;
    EXPECT_EQ(first, base.bytes.size()) << s.name() << ": the outputs differ from byte " << first;
  }
  ASSERT_TRUE(setHostIsa(before).ok());
}

// The alternating P step's dot products, in the order its kernel states (8 lanes, element c into
// lane c mod 8 over the whole multiples of 8, the rest into lanes 0.., lanes summed
// ((0+4)+(2+6))+((1+5)+(3+7))), one element at a time: the kernel's P must equal it to the bit
// under each instruction set, whatever its rows' blocking (a kernel summing in its vector's own
// order, as PowerSGD's pass 1 does, fails this).
// Each product is rounded before its addition (volatile), as the kernel's -ffp-contract=off does,
// whatever contraction a build of the tests allows.
float laneDot(const float* m, const float* q, size_t len) {
  float a[8] = {};
  const size_t whole = len / 8 * 8;
  for (size_t c = 0; c < len; ++c) {
    volatile float prod = m[c] * q[c];
    a[c < whole ? c % 8 : c - whole] += prod;
  }
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

TEST(HostIsa, AlternatingPStepSumsInEightFixedLanes) {
  std::vector<HostIsa> isas = {HostIsa::baseline};
  if (hostIsaSupported(HostIsa::avx2)) isas.push_back(HostIsa::avx2);
  const HostIsa before = hostIsa();
  // rows: 4-row blocks and the rows after them; widths: below 8, whole multiples, tails; a padded
  // last row; a column block (ld > cols); odd and even k (2-column sweeps and a single one).
  const Shape shapes[] = {{23, 37, 37, 23 * 37, 3, lowrankFloat32},
                          {8, 64, 64, 8 * 64, 4, lowrankFloat32},
                          {6, 5, 5, 30, 1, lowrankFloat32},
                          {30, 41, 41, 29 * 41 + 17, 5, lowrankFloat32},
                          {17, 24, 53, 17 * 53, 2, lowrankFloat32},
                          {5, 1031, 1031, 5 * 1031, 12, lowrankFloat32}};
  for (HostIsa isa : isas) {
    ASSERT_TRUE(setHostIsa(isa).ok());
    for (const Shape& s : shapes) {
      MatrixView v{s.rows, s.cols, s.valid, s.ld == s.cols ? 0 : s.ld};
      const std::vector<float> g = randomVec(s.rows * s.ld, 21);
      const std::vector<float> qt = randomVec(size_t(s.k) * s.cols, 22);
      std::vector<float> p(s.rows * size_t(s.k), -1.f);
      EXPECT_EQ(alternateStepP(g.data(), lowrankFloat32, nullptr, v, qt.data(), s.k, p.data(),
                               INFINITY, lowrankFloat32), 0u);
      for (size_t i = 0; i < s.rows; ++i)
        for (int j = 0; j < s.k; ++j) {
          const float want = laneDot(g.data() + i * s.ld, qt.data() + size_t(j) * s.cols, v.rowLength(i));
          const float got = p[i * s.k + j];
          EXPECT_EQ(std::memcmp(&got, &want, 4), 0)
              << s.name() << " " << hostIsaName(isa) << ": P[" << i << "][" << j << "] " << got
              << ", the fixed lanes give " << want;
        }
    }
  }
  ASSERT_TRUE(setHostIsa(before).ok());
}

TEST(HostIsa, ChoiceAndErrors) {
  EXPECT_TRUE(hostIsaSupported(HostIsa::baseline));
  EXPECT_STREQ(hostIsaName(HostIsa::avx2), "avx2");
  EXPECT_STREQ(hostIsaName(HostIsa::baseline), "baseline");
  const HostIsa before = hostIsa();
  ASSERT_TRUE(setHostIsa(HostIsa::baseline).ok());
  EXPECT_EQ(hostIsa(), HostIsa::baseline);
  if (!hostIsaSupported(HostIsa::avx2)) {
    const lowrank::Status s = setHostIsa(HostIsa::avx2);
    EXPECT_EQ(s.code, lowrankInvalidUsage);
    EXPECT_EQ(hostIsa(), HostIsa::baseline);  // unchanged
  }
  ASSERT_TRUE(setHostIsa(before).ok());
}

TEST(HostIsa, EnvironmentVariable) {
  using lowrank::testing::EnvGuard;
  HostIsa isa = HostIsa::avx2;
  {
    EnvGuard g("LOWRANK_HOST_ISA", "BaseLine");  // any case
    ASSERT_TRUE(hostIsaFromEnv(&isa).ok());
    EXPECT_EQ(isa, HostIsa::baseline);
  }
  for (const char* automatic : {"auto", static_cast<const char*>(nullptr)}) {
    EnvGuard g("LOWRANK_HOST_ISA", automatic);
    ASSERT_TRUE(hostIsaFromEnv(&isa).ok());
    EXPECT_EQ(isa, hostIsaSupported(HostIsa::avx2) ? HostIsa::avx2 : HostIsa::baseline);
  }
  {
    EnvGuard g("LOWRANK_HOST_ISA", "avx2");
    const lowrank::Status s = hostIsaFromEnv(&isa);
    if (hostIsaSupported(HostIsa::avx2)) {
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(isa, HostIsa::avx2);
    } else {
      EXPECT_EQ(s.code, lowrankInvalidUsage);
    }
  }
  {
    EnvGuard g("LOWRANK_HOST_ISA", "avx512");
    isa = HostIsa::baseline;
    const lowrank::Status s = hostIsaFromEnv(&isa);
    EXPECT_EQ(s.code, lowrankInvalidUsage);
    EXPECT_NE(s.msg.find("LOWRANK_HOST_ISA"), std::string::npos) << s.msg;
    EXPECT_NE(s.msg.find("avx512"), std::string::npos) << s.msg;
    EXPECT_EQ(isa, HostIsa::baseline);  // left alone
  }
}

}  // namespace
