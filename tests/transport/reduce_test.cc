// The element-wise reductions of the transports (plugin/transport/reduce.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "util/convert.h"
#include "transport/reduce.h"

namespace lowrank::transport {
namespace {

using host::bf16_t;
using host::half_t;

TEST(Reduce, HalfSumRoundsToNearestEvenOnce) {
  // 1 + 2^-11 is halfway between two halves: the float sum rounds to even (1.0);
  // 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
  half_t a[2] = {host::toHalf(1.0f), host::toHalf(1.0f)};
  half_t b[2] = {host::toHalf(std::ldexp(1.0f, -11)), host::toHalf(3 * std::ldexp(1.0f, -11))};
  reduceInto(a, b, 2, lowrankFloat16, lowrankSum);
  EXPECT_EQ(host::toFloat(a[0]), 1.0f);
  EXPECT_EQ(host::toFloat(a[1]), 1.0f + std::ldexp(1.0f, -9));
}

TEST(Reduce, Bf16ProdAndAvg) {
  bf16_t a[2] = {host::toBf16(3.0f), host::toBf16(-1.5f)};
  bf16_t b[2] = {host::toBf16(0.5f), host::toBf16(4.0f)};
  reduceInto(a, b, 2, lowrankBfloat16, lowrankProd);
  EXPECT_EQ(host::toFloat(a[0]), 1.5f);
  EXPECT_EQ(host::toFloat(a[1]), -6.0f);
  divideBy(a, 2, lowrankBfloat16, 3);  // 1.5/3 = 0.5 exactly; -6/3 = -2
  EXPECT_EQ(host::toFloat(a[0]), 0.5f);
  EXPECT_EQ(host::toFloat(a[1]), -2.0f);
}

TEST(Reduce, IntegersWrapAndAvgTruncates) {
  int8_t a[3] = {100, -100, -7};
  int8_t b[3] = {100, -100, 0};
  reduceInto(a, b, 3, lowrankInt8, lowrankSum);
  EXPECT_EQ(a[0], int8_t(-56));  // 200 wraps
  EXPECT_EQ(a[1], int8_t(56));
  divideBy(a, 3, lowrankInt8, 2);
  EXPECT_EQ(a[2], -3);  // truncation toward zero, as C and ncclAvg
  EXPECT_EQ(a[0], -28);
  uint32_t u[1] = {0xffffffffu}, v[1] = {3};
  reduceInto(u, v, 1, lowrankUint32, lowrankProd);
  EXPECT_EQ(u[0], 0xfffffffdu);
  int64_t m[1] = {std::numeric_limits<int64_t>::max()}, n[1] = {1};
  reduceInto(m, n, 1, lowrankInt64, lowrankSum);
  EXPECT_EQ(m[0], std::numeric_limits<int64_t>::min());
}

TEST(Reduce, MaxMinPropagateNaN) {
  float a[3] = {1.0f, NAN, -2.0f}, b[3] = {NAN, 1.0f, -3.0f};
  reduceInto(a, b, 3, lowrankFloat32, lowrankMax);
  EXPECT_TRUE(std::isnan(a[0]));
  EXPECT_TRUE(std::isnan(a[1]));
  EXPECT_EQ(a[2], -2.0f);
  double c[2] = {5.0, -1.0}, d[2] = {4.0, 7.0};
  reduceInto(c, d, 2, lowrankFloat64, lowrankMin);
  EXPECT_EQ(c[0], 4.0);
  EXPECT_EQ(c[1], -1.0);
  uint64_t e[1] = {~uint64_t(0)}, f[1] = {1};
  reduceInto(e, f, 1, lowrankUint64, lowrankMin);
  EXPECT_EQ(e[0], 1u);
}

TEST(Reduce, HalfAvgDividesInFloat) {
  half_t a[1] = {host::toHalf(1.0f)};
  divideBy(a, 1, lowrankFloat16, 3);
  EXPECT_EQ(a[0].bits, host::toHalf(1.0f / 3.0f).bits);
  float f[1] = {1.0f};
  divideBy(f, 1, lowrankFloat32, 1);  // N == 1: identity
  EXPECT_EQ(f[0], 1.0f);
}

TEST(Reduce, Validity) {
  EXPECT_TRUE(reductionValid(lowrankBfloat16, lowrankAvg));
  EXPECT_FALSE(reductionValid(lowrankNumTypes, lowrankSum));
  EXPECT_FALSE(reductionValid(lowrankFloat32, lowrankNumOps));
  EXPECT_FALSE(reductionValid(lowrankDataType_t(-1), lowrankSum));
}

}  // namespace
}  // namespace lowrank::transport
