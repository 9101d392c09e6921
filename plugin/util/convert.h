// float16 / bfloat16 <-> float32 conversions, round-to-nearest-even, NaN and Inf preserved.
// Header-only so that kernels inline them in their inner loops.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lowrank/lowrank.h"

namespace lowrank::host {

struct half_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

inline float toFloat(float x) { return x; }

inline float toFloat(bf16_t x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float toFloat(half_t x) {
  uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400u));
    u = sign | ((112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1);
  return {uint16_t(u >> 16)};
}

inline half_t toHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};          // NaN
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};         // overflow (>= 65520) -> Inf
  if (a < 0x38800000u) {                                           // subnormal or zero half
    if (a < 0x33000000u) return {uint16_t(sign)};                  // < 2^-25: rounds to 0
    uint32_t e = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                                      // 14 .. 24
    uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    return {uint16_t(sign | r)};
  }
  uint32_t r = a - 0x38000000u;                                    // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1);
  return {uint16_t(sign | (r >> 13))};
}

// One scalar of a floating dtype (float16, bfloat16, float32, float64; lowrank.h's numbers, which
// are NCCL's) as a double, exactly; false for the other dtypes.
inline bool scalarToDouble(int dtype, const void* bytes, double* out) {
  uint16_t h;
  float f;
  switch (dtype) {
    case lowrankFloat16: std::memcpy(&h, bytes, 2); *out = toFloat(half_t{h}); return true;
    case lowrankBfloat16: std::memcpy(&h, bytes, 2); *out = toFloat(bf16_t{h}); return true;
    case lowrankFloat32: std::memcpy(&f, bytes, 4); *out = f; return true;
    case lowrankFloat64: std::memcpy(out, bytes, 8); return true;
    default: return false;
  }
}

template <typename T> inline T fromFloat(float f);
template <> inline float fromFloat<float>(float f) { return f; }
template <> inline half_t fromFloat<half_t>(float f) { return toHalf(f); }
template <> inline bf16_t fromFloat<bf16_t>(float f) { return toBf16(f); }

// Rounds n floats in place to the values of dtype t (bfloat16 or float16, to nearest even); other
// dtypes leave them as they are. The 16-bit factors' rounding (transport/wire.h, the alternating
// kernels' own factor): one loop, so both round to the same bits.
inline void roundTo(lowrankDataType_t t, float* x, size_t n) {
  if (t == lowrankBfloat16)
    for (size_t i = 0; i < n; ++i) x[i] = toFloat(toBf16(x[i]));
  else if (t == lowrankFloat16)
    for (size_t i = 0; i < n; ++i) x[i] = toFloat(toHalf(x[i]));
}

}  // namespace lowrank::host
