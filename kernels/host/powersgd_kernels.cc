#include "kernels/host/powersgd_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/host/convert.h"

namespace lowrank::host {
namespace {

inline bool nonFinite(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x7f800000u) == 0x7f800000u;
}

inline float dot(const float* __restrict a, const float* __restrict b, size_t len) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (size_t c = 0; c < len; ++c) acc += a[c] * b[c];
  return acc;
}

// Row buffer for dtypes that are not float32 (and float32 without error feedback, no copy).
thread_local std::vector<float> tlsRow;

template <typename T>
size_t pass1(const T* __restrict g, float* __restrict e, const MatrixView& v,
             const float* __restrict qt, int k, float* __restrict p) {
  size_t bad = 0;
  if (!e && !std::is_same_v<T, float>) tlsRow.resize(v.cols);
  for (size_t i = 0; i < v.rows; ++i) {
    const size_t len = v.rowLength(i), off = i * v.cols;
    const float* m;
    if (e) {
      float* er = e + off;
      const T* gr = g + off;
#pragma omp simd reduction(+ : bad)
      for (size_t c = 0; c < len; ++c) {
        float x = toFloat(gr[c]) + er[c];
        er[c] = x;
        bad += nonFinite(x);
      }
      m = er;
    } else if constexpr (std::is_same_v<T, float>) {
      m = g + off;
#pragma omp simd reduction(+ : bad)
      for (size_t c = 0; c < len; ++c) bad += nonFinite(m[c]);
    } else {
      float* row = tlsRow.data();
      const T* gr = g + off;
#pragma omp simd reduction(+ : bad)
      for (size_t c = 0; c < len; ++c) {
        row[c] = toFloat(gr[c]);
        bad += nonFinite(row[c]);
      }
      m = row;
    }
    for (int j = 0; j < k; ++j) p[i * k + j] = dot(m, qt + size_t(j) * v.cols, len);
  }
  return bad;
}

template <typename T>
void pass2(const T* __restrict g, const float* __restrict e, const MatrixView& v,
           const float* __restrict p, int k, float* __restrict qt) {
  std::memset(qt, 0, sizeof(float) * size_t(k) * v.cols);
  if (!e && !std::is_same_v<T, float>) tlsRow.resize(v.cols);
  for (size_t i = 0; i < v.rows; ++i) {
    const size_t len = v.rowLength(i), off = i * v.cols;
    if (len == 0) break;
    const float* m;
    if (e) {
      m = e + off;
    } else if constexpr (std::is_same_v<T, float>) {
      m = g + off;
    } else {
      float* row = tlsRow.data();
      for (size_t c = 0; c < len; ++c) row[c] = toFloat(g[off + c]);
      m = row;
    }
    for (int j = 0; j < k; ++j) {
      const float pij = p[i * k + j];
      float* __restrict q = qt + size_t(j) * v.cols;
#pragma omp simd
      for (size_t c = 0; c < len; ++c) q[c] += pij * m[c];
    }
  }
}

template <typename T>
void pass3(float* __restrict e, const MatrixView& v, const float* __restrict p,
           const float* __restrict qbart, int k, float s, T* out) {
  std::vector<float>& a = tlsRow;
  a.resize(v.cols);
  for (size_t i = 0; i < v.rows; ++i) {
    const size_t len = v.rowLength(i), off = i * v.cols;
    if (len == 0) break;
    float* __restrict ar = a.data();
    const float p0 = p[i * k];
#pragma omp simd
    for (size_t c = 0; c < len; ++c) ar[c] = p0 * qbart[c];
    for (int j = 1; j < k; ++j) {
      const float pij = p[i * k + j];
      const float* __restrict q = qbart + size_t(j) * v.cols;
#pragma omp simd
      for (size_t c = 0; c < len; ++c) ar[c] += pij * q[c];
    }
    T* o = out + off;
    if (e) {
      float* __restrict er = e + off;
#pragma omp simd
      for (size_t c = 0; c < len; ++c) {
        er[c] -= ar[c];
        o[c] = fromFloat<T>(s * ar[c]);
      }
    } else {
#pragma omp simd
      for (size_t c = 0; c < len; ++c) o[c] = fromFloat<T>(s * ar[c]);
    }
  }
}

}  // namespace

size_t errorFeedbackAndP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                         const float* qt, int k, float* p) {
  switch (dtype) {
    case lowrankFloat16: return pass1(static_cast<const half_t*>(g), e, v, qt, k, p);
    case lowrankBfloat16: return pass1(static_cast<const bf16_t*>(g), e, v, qt, k, p);
    default: return pass1(static_cast<const float*>(g), e, v, qt, k, p);
  }
}

void computeQ(const void* g, lowrankDataType_t dtype, const float* e, const MatrixView& v,
              const float* p, int k, float* qt) {
  switch (dtype) {
    case lowrankFloat16: return pass2(static_cast<const half_t*>(g), e, v, p, k, qt);
    case lowrankBfloat16: return pass2(static_cast<const bf16_t*>(g), e, v, p, k, qt);
    default: return pass2(static_cast<const float*>(g), e, v, p, k, qt);
  }
}

void decompressAndUpdateError(float* e, const MatrixView& v, const float* p, const float* qbart,
                              int k, float s, void* out, lowrankDataType_t dtype) {
  switch (dtype) {
    case lowrankFloat16: return pass3(e, v, p, qbart, k, s, static_cast<half_t*>(out));
    case lowrankBfloat16: return pass3(e, v, p, qbart, k, s, static_cast<bf16_t*>(out));
    default: return pass3(e, v, p, qbart, k, s, static_cast<float*>(out));
  }
}

void scale(float* x, size_t count, float s) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) x[i] *= s;
}

namespace {
template <typename T>
size_t countBad(const T* x, size_t count) {
  size_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (size_t i = 0; i < count; ++i) bad += nonFinite(toFloat(x[i]));
  return bad;
}
template <typename T>
void toF32(const T* src, size_t count, float* dst) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) dst[i] = toFloat(src[i]);
}
template <typename T>
void fromF32(const float* src, size_t count, float s, T* dst) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) dst[i] = fromFloat<T>(s * src[i]);
}
}  // namespace

size_t countNonFinite(const void* x, size_t count, lowrankDataType_t dtype) {
  switch (dtype) {
    case lowrankFloat16: return countBad(static_cast<const half_t*>(x), count);
    case lowrankBfloat16: return countBad(static_cast<const bf16_t*>(x), count);
    default: return countBad(static_cast<const float*>(x), count);
  }
}

void toFloat32(const void* src, lowrankDataType_t dtype, size_t count, float* dst) {
  switch (dtype) {
    case lowrankFloat16: return toF32(static_cast<const half_t*>(src), count, dst);
    case lowrankBfloat16: return toF32(static_cast<const bf16_t*>(src), count, dst);
    default: return toF32(static_cast<const float*>(src), count, dst);
  }
}

void fromFloat32(const float* src, size_t count, float s, void* dst, lowrankDataType_t dtype) {
  switch (dtype) {
    case lowrankFloat16: return fromF32(src, count, s, static_cast<half_t*>(dst));
    case lowrankBfloat16: return fromF32(src, count, s, static_cast<bf16_t*>(dst));
    default: return fromF32(src, count, s, static_cast<float*>(dst));
  }
}

}  // namespace lowrank::host
