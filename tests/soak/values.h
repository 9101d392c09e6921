// Soak inputs: counter-based random values (the same from any thread, so a seed replays a run),
// and element access to every lowrank dtype through double, for the references.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "util/convert.h"
#include "lowrank/lowrank.h"

namespace lowrank::soak {

using host::bf16_t;
using host::half_t;

// splitmix64's finalizer: a well-mixed 64-bit hash.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t stream(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }
inline uint64_t stream(uint64_t a, uint64_t b, uint64_t c) { return stream(stream(a, b), c); }

// Uniform in [-1, 1), element i of stream s.
inline float uniform(uint64_t s, size_t i) { return float(mix64(s + i) >> 40) * 0x1p-23f - 1.f; }
// Uniform integer in [0, n), element i of stream s.
inline uint64_t below(uint64_t s, size_t i, uint64_t n) { return mix64(s + i) % n; }

// Calls f(T{}) with T the C++ type of dtype (half_t / bf16_t for the 16-bit floats).
template <typename F>
decltype(auto) withType(lowrankDataType_t t, F&& f) {
  switch (t) {
    case lowrankInt8:
      return f(int8_t{});
    case lowrankUint8:
      return f(uint8_t{});
    case lowrankInt32:
      return f(int32_t{});
    case lowrankUint32:
      return f(uint32_t{});
    case lowrankInt64:
      return f(int64_t{});
    case lowrankUint64:
      return f(uint64_t{});
    case lowrankFloat16:
      return f(half_t{});
    case lowrankBfloat16:
      return f(bf16_t{});
    case lowrankFloat64:
      return f(double{});
    default:
      return f(float{});
  }
}

template <typename T>
inline double toDouble(T x) {
  return double(x);
}
template <>
inline double toDouble(half_t x) {
  return host::toFloat(x);
}
template <>
inline double toDouble(bf16_t x) {
  return host::toFloat(x);
}

// Rounds to T (nearest even for the floats); integers must be in range.
template <typename T>
inline T fromDouble(double v) {
  return T(v);
}
template <>
inline half_t fromDouble(double v) {
  return host::toHalf(float(v));
}
template <>
inline bf16_t fromDouble(double v) {
  return host::toBf16(float(v));
}

// Unit roundoff of a float dtype (half an ulp at 1): what one rounding to it may lose, relatively.
inline double unitRoundoff(lowrankDataType_t t) {
  switch (t) {
    case lowrankFloat16:
      return 0x1p-11;
    case lowrankBfloat16:
      return 0x1p-8;
    case lowrankFloat64:
      return 0x1p-53;
    default:
      return 0x1p-24;
  }
}

inline bool isFloat(lowrankDataType_t t) {
  return t == lowrankFloat16 || t == lowrankBfloat16 || t == lowrankFloat32 || t == lowrankFloat64;
}

// Input of an exact (uncompressed) call: values whose reduction is exact in any order and
// representable in the dtype, so that every comm rank must get the reference bit for bit:
// small integers for sum (dyadic eighths in float64, which avg divides by 4 exactly), +-1/2,
// +-1, +-2 for prod, anything representable for max and min.
template <typename T>
T exactInput(lowrankRedOp_t op, uint64_t s, size_t i) {
  constexpr bool isInt = std::is_integral_v<T>;
  constexpr bool isUnsigned = std::is_unsigned_v<T>;
  switch (op) {
    case lowrankProd: {
      static constexpr double kSigned[] = {-2, -1, 1, 2}, kFloat[] = {-2, -1, -0.5, 0.5, 1, 2};
      if constexpr (isUnsigned)
        return T(1 + below(s, i, 2));
      else if constexpr (isInt)
        return T(kSigned[below(s, i, 4)]);
      else
        return fromDouble<T>(kFloat[below(s, i, 6)]);
    }
    case lowrankMax:
    case lowrankMin:
      if constexpr (isUnsigned)
        return T(below(s, i, 200));
      else if constexpr (isInt)
        return T(int(below(s, i, 201)) - 100);
      else
        return fromDouble<T>(100.0 * uniform(s, i));
    default:  // sum, avg
      if constexpr (isUnsigned)
        return T(below(s, i, 41));
      else if constexpr (isInt)
        return T(int(below(s, i, 41)) - 20);
      else
        return fromDouble<T>((double(below(s, i, 2001)) - 1000.0) / 8.0);
  }
}

}  // namespace lowrank::soak
