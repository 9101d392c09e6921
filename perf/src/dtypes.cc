#include "dtypes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace perf {

namespace {
struct TypeInfo {
  lowrankDataType_t t;
  const char* name;
  size_t size;
};
constexpr TypeInfo kTypes[] = {
    {lowrankInt8, "int8", 1},      {lowrankUint8, "uint8", 1},     {lowrankInt32, "int32", 4},
    {lowrankUint32, "uint32", 4},  {lowrankInt64, "int64", 8},     {lowrankUint64, "uint64", 8},
    {lowrankFloat16, "half", 2},   {lowrankFloat32, "float", 4},   {lowrankFloat64, "double", 8},
    {lowrankBfloat16, "bfloat16", 2},
};
}  // namespace

const char* typeName(lowrankDataType_t t) {
  for (const auto& i : kTypes)
    if (i.t == t) return i.name;
  return "?";
}

std::optional<lowrankDataType_t> parseType(const std::string& s) {
  struct Alias {
    const char* name;
    lowrankDataType_t t;
  };
  static const Alias aliases[] = {
      {"int8", lowrankInt8},         {"char", lowrankInt8},         {"uint8", lowrankUint8},
      {"int32", lowrankInt32},       {"int", lowrankInt32},         {"uint32", lowrankUint32},
      {"int64", lowrankInt64},       {"uint64", lowrankUint64},     {"half", lowrankFloat16},
      {"float16", lowrankFloat16},   {"fp16", lowrankFloat16},      {"float", lowrankFloat32},
      {"float32", lowrankFloat32},   {"fp32", lowrankFloat32},      {"double", lowrankFloat64},
      {"float64", lowrankFloat64},   {"fp64", lowrankFloat64},      {"bfloat16", lowrankBfloat16},
      {"bf16", lowrankBfloat16},
  };
  for (const auto& a : aliases)
    if (s == a.name) return a.t;
  return std::nullopt;
}

std::vector<lowrankDataType_t> allTypes() {
  std::vector<lowrankDataType_t> v;
  for (const auto& i : kTypes) v.push_back(i.t);
  return v;
}

size_t typeSize(lowrankDataType_t t) {
  for (const auto& i : kTypes)
    if (i.t == t) return i.size;
  return 0;
}

bool isFloating(lowrankDataType_t t) {
  return t == lowrankFloat16 || t == lowrankFloat32 || t == lowrankFloat64 || t == lowrankBfloat16;
}

bool isSigned(lowrankDataType_t t) {
  return t != lowrankUint8 && t != lowrankUint32 && t != lowrankUint64;
}

const char* opName(lowrankRedOp_t op) {
  switch (op) {
    case lowrankSum: return "sum";
    case lowrankProd: return "prod";
    case lowrankMax: return "max";
    case lowrankMin: return "min";
    case lowrankAvg: return "avg";
    default: return "?";
  }
}

std::optional<lowrankRedOp_t> parseOp(const std::string& s) {
  for (auto op : allOps())
    if (s == opName(op)) return op;
  return std::nullopt;
}

std::vector<lowrankRedOp_t> allOps() {
  return {lowrankSum, lowrankProd, lowrankMax, lowrankMin, lowrankAvg};
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp - 150); in units of 2^-24 (the half subnormal step) that is
    // mant * 2^(exp - 126): drop (126 - exp) bits of mant, rounding to nearest even.
    const int rshift = 126 - static_cast<int>(absx >> 23);
    uint32_t h = mant >> rshift;
    const uint32_t rem = mant & ((1u << rshift) - 1u);
    const uint32_t half = 1u << (rshift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even
  uint32_t h = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&x, &f, 4);
      x |= sign;
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double loadAsDouble(const void* buf, lowrankDataType_t t, size_t i) {
  switch (t) {
    case lowrankInt8: return static_cast<const int8_t*>(buf)[i];
    case lowrankUint8: return static_cast<const uint8_t*>(buf)[i];
    case lowrankInt32: return static_cast<const int32_t*>(buf)[i];
    case lowrankUint32: return static_cast<const uint32_t*>(buf)[i];
    case lowrankInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case lowrankUint64: return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case lowrankFloat16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case lowrankFloat32: return static_cast<const float*>(buf)[i];
    case lowrankFloat64: return static_cast<const double*>(buf)[i];
    case lowrankBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    default: return 0.0;
  }
}

namespace {
template <typename I>
I saturate(double v) {
  if (std::isnan(v)) return 0;
  v = std::nearbyint(v);
  const double lo = static_cast<double>(std::numeric_limits<I>::min());
  const double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}
}  // namespace

void storeFromDouble(void* buf, lowrankDataType_t t, size_t i, double v) {
  switch (t) {
    case lowrankInt8: static_cast<int8_t*>(buf)[i] = saturate<int8_t>(v); break;
    case lowrankUint8: static_cast<uint8_t*>(buf)[i] = saturate<uint8_t>(v); break;
    case lowrankInt32: static_cast<int32_t*>(buf)[i] = saturate<int32_t>(v); break;
    case lowrankUint32: static_cast<uint32_t*>(buf)[i] = saturate<uint32_t>(v); break;
    case lowrankInt64: static_cast<int64_t*>(buf)[i] = saturate<int64_t>(v); break;
    case lowrankUint64: static_cast<uint64_t*>(buf)[i] = saturate<uint64_t>(v); break;
    case lowrankFloat16:
      static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v));
      break;
    case lowrankFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case lowrankFloat64: static_cast<double*>(buf)[i] = v; break;
    case lowrankBfloat16:
      static_cast<uint16_t*>(buf)[i] = floatToBf16(static_cast<float>(v));
      break;
    default: break;
  }
}

void toDouble(const void* src, lowrankDataType_t t, size_t n, double* dst) {
  if (t == lowrankFloat32) {
    const float* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = s[i];
    return;
  }
  if (t == lowrankFloat64) {
    std::memcpy(dst, src, n * sizeof(double));
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = loadAsDouble(src, t, i);
}

void fromFloat(const float* src, size_t n, lowrankDataType_t t, void* dst) {
  switch (t) {
    case lowrankFloat32: std::memcpy(dst, src, n * sizeof(float)); return;
    case lowrankFloat16: floatToHalfN(src, static_cast<uint16_t*>(dst), n); return;
    case lowrankBfloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(src[i]);
      return;
    }
    default:
      for (size_t i = 0; i < n; ++i) storeFromDouble(dst, t, i, src[i]);
      return;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// F16C: 8 conversions per instruction, round to nearest even (as floatToHalf), chosen at run time.
namespace {
__attribute__((target("f16c,avx"))) void floatToHalfF16c(const float* src, uint16_t* dst,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = floatToHalf(src[i]);
}
__attribute__((target("f16c,avx"))) void halfToFloatF16c(const uint16_t* src, float* dst,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = halfToFloat(src[i]);
}
bool haveF16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
}  // namespace
#endif

void floatToHalfN(const float* src, uint16_t* dst, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (haveF16c()) return floatToHalfF16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = floatToHalf(src[i]);
}

void halfToFloatN(const uint16_t* src, float* dst, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (haveF16c()) return halfToFloatF16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = halfToFloat(src[i]);
}

}  // namespace perf
