// float16 / bfloat16 conversions: exhaustive round trips and rounding against references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "util/convert.h"

using namespace lowrank::host;

namespace {
bool isNanBits16(uint16_t b, int expBits) {
  const uint16_t expMask = expBits == 5 ? 0x7c00 : 0x7f80, manMask = expBits == 5 ? 0x3ff : 0x7f;
  return (b & expMask) == expMask && (b & manMask);
}
}  // namespace

TEST(Convert, HalfRoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    half_t h{uint16_t(b)};
    float f = toFloat(h);
    if (isNanBits16(uint16_t(b), 5)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(isNanBits16(toHalf(f).bits, 5));
    } else {
      ASSERT_EQ(toHalf(f).bits, b) << "bits 0x" << std::hex << b;
    }
  }
}

TEST(Convert, BfloatRoundTripsEveryBitPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    bf16_t h{uint16_t(b)};
    float f = toFloat(h);
    if (isNanBits16(uint16_t(b), 8)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(isNanBits16(toBf16(f).bits, 8));
    } else {
      ASSERT_EQ(toBf16(f).bits, b) << "bits 0x" << std::hex << b;
    }
  }
}

#ifdef __FLT16_MAX__
TEST(Convert, HalfRoundsAsTheCompilersFloat16) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    _Float16 ref = (_Float16)f;
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(toHalf(f).bits, rb) << "float " << f;
  }
}
#endif

TEST(Convert, BfloatRoundsToNearestEven) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = bits(rng) & 0x7f7fffffu;  // finite, below the overflow boundary
    float f;
    std::memcpy(&f, &u, 4);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u, r = uint32_t(toBf16(f).bits) << 16;
    const uint32_t rem = u & 0xffffu;
    const uint32_t want = rem < 0x8000u ? lo : rem > 0x8000u ? hi : ((lo >> 16) & 1 ? hi : lo);
    ASSERT_EQ(r, want) << "bits 0x" << std::hex << u;
  }
}

TEST(Convert, HalfOverflowAndUnderflow) {
  EXPECT_EQ(toHalf(65504.f).bits, 0x7bffu);
  EXPECT_EQ(toHalf(65520.f).bits, 0x7c00u);  // rounds up to Inf
  EXPECT_EQ(toHalf(-1e9f).bits, 0xfc00u);
  EXPECT_EQ(toHalf(INFINITY).bits, 0x7c00u);
  EXPECT_EQ(toHalf(std::ldexp(1.f, -24)).bits, 0x0001u);  // smallest subnormal
  EXPECT_EQ(toHalf(std::ldexp(1.f, -26)).bits, 0x0000u);
  EXPECT_FLOAT_EQ(toFloat(half_t{0x3c00}), 1.0f);
  EXPECT_FLOAT_EQ(toFloat(bf16_t{0x3f80}), 1.0f);
}
