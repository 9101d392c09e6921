#include "kernels/host/powersgd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "util/convert.h"

namespace lowrank::host {
namespace {

inline bool nonFinite(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x7f800000u) == 0x7f800000u;
}

// |x| >= the limit whose bits are limBits, or x is NaN or Inf: on the magnitude bits of an IEEE
// float, order is that of |x|, and NaN and Inf sit above every finite value.
inline bool beyond(float x, uint32_t limBits) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x7fffffffu) >= limBits;
}

inline uint32_t limitBits(float limit) {
  uint32_t u;
  std::memcpy(&u, &limit, 4);
  return u & 0x7fffffffu;
}

inline float dot(const float* __restrict a, const float* __restrict b, size_t len) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (size_t c = 0; c < len; ++c) acc += a[c] * b[c];
  return acc;
}

// Rows are processed in blocks of kBlock: each row of Qt (k x m, L2-resident) is then streamed
// once per block instead of once per row, which keeps pass 1 and 2 memory-bound up to k = 8.
constexpr int kBlock = 4;

// Row i of M as float32. Pass 1 (add = true) fuses the error-feedback add (E += G, in place) and
// counts non-finite values; pass 2 (add = false) reads M = E, or G without error feedback.
// Without E, a G that is not float32 is converted into rows + slot * cols (see rowScratch).
template <typename T, bool add>
inline const float* rowOfM(const T* __restrict g, float* __restrict e, const MatrixView& v,
                           size_t i, int slot, float* rows, size_t* bad, uint32_t limBits) {
  const size_t len = v.rowLength(i), off = i * v.stride();
  const T* gr = g + off;
  if (e) {
    float* er = e + off;
    if (add) {
      size_t b = 0;
#pragma omp simd reduction(+ : b)
      for (size_t c = 0; c < len; ++c) {
        float x = toFloat(gr[c]) + er[c];
        er[c] = x;
        b += beyond(x, limBits);
      }
      *bad += b;
    }
    return er;
  }
  const float* m;
  if constexpr (std::is_same_v<T, float>) {
    m = gr;
  } else {
    float* row = rows + size_t(slot) * v.cols;
#pragma omp simd
    for (size_t c = 0; c < len; ++c) row[c] = toFloat(gr[c]);
    m = row;
  }
  if (add) {
    size_t b = 0;
#pragma omp simd reduction(+ : b)
    for (size_t c = 0; c < len; ++c) b += beyond(m[c], limBits);
    *bad += b;
  }
  return m;
}

// Elements of the row scratch rowOfM needs: kBlock rows of M when G is not float32 and there is
// no E to read M from. Per call, not per thread: a thread would otherwise keep the rows of the
// widest matrix it ever saw after every buffer is released.
template <typename T>
size_t rowScratch(const float* e, const MatrixView& v) {
  return !e && !std::is_same_v<T, float> ? size_t(kBlock) * v.cols : 0;
}

template <typename T>
size_t pass1(const T* __restrict g, float* __restrict e, const MatrixView& v,
             const float* __restrict qt, int k, float* __restrict p, float limit) {
  size_t bad = 0;
  const uint32_t lim = limitBits(limit);
  std::vector<float> rows(rowScratch<T>(e, v));
  const size_t full = v.fullRows();
  size_t i = 0;
  for (; i + kBlock <= full; i += kBlock) {
    const float* m[kBlock];
    for (int b = 0; b < kBlock; ++b)
      m[b] = rowOfM<T, true>(g, e, v, i + b, b, rows.data(), &bad, lim);
    for (int j = 0; j < k; ++j) {
      const float* __restrict q = qt + size_t(j) * v.cols;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (size_t c = 0; c < v.cols; ++c) {
        a0 += m[0][c] * q[c];
        a1 += m[1][c] * q[c];
        a2 += m[2][c] * q[c];
        a3 += m[3][c] * q[c];
      }
      p[(i + 0) * k + j] = a0;
      p[(i + 1) * k + j] = a1;
      p[(i + 2) * k + j] = a2;
      p[(i + 3) * k + j] = a3;
    }
  }
  for (; i < v.rows; ++i) {
    const size_t len = v.rowLength(i);
    const float* m = rowOfM<T, true>(g, e, v, i, 0, rows.data(), &bad, lim);
    for (int j = 0; j < k; ++j) p[i * k + j] = dot(m, qt + size_t(j) * v.cols, len);
  }
  return bad;
}

// add: M = G + E first (E += G in place), counting elements beyond the limit into *bad (the
// alternating Q step's pass); else M is E, or G without error feedback (PowerSGD's pass 2).
template <typename T, bool add = false>
void pass2(const T* __restrict g, const float* __restrict e, const MatrixView& v,
           const float* __restrict p, int k, float* __restrict qt, size_t* bad = nullptr,
           uint32_t lim = 0) {
  std::memset(qt, 0, sizeof(float) * size_t(k) * v.cols);
  std::vector<float> rows(rowScratch<T>(e, v));
  float* em = const_cast<float*>(e);  // rowOfM<.., false> never writes
  const size_t full = v.fullRows();
  size_t i = 0, none = 0;
  size_t* count = add ? bad : &none;
  for (; i + kBlock <= full; i += kBlock) {
    const float* m[kBlock];
    for (int b = 0; b < kBlock; ++b)
      m[b] = rowOfM<T, add>(g, em, v, i + b, b, rows.data(), count, lim);
    for (int j = 0; j < k; ++j) {
      const float p0 = p[i * k + j], p1 = p[(i + 1) * k + j], p2 = p[(i + 2) * k + j],
                  p3 = p[(i + 3) * k + j];
      float* __restrict q = qt + size_t(j) * v.cols;
      // Same order of additions as one row at a time: the result does not depend on blocking.
#pragma omp simd
      for (size_t c = 0; c < v.cols; ++c)
        q[c] = (((q[c] + p0 * m[0][c]) + p1 * m[1][c]) + p2 * m[2][c]) + p3 * m[3][c];
    }
  }
  for (; i < v.rows; ++i) {
    const size_t len = v.rowLength(i);
    if (len == 0) break;
    const float* m = rowOfM<T, add>(g, em, v, i, 0, rows.data(), count, lim);
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
  std::vector<float> a(v.cols);  // one row of P Qbar^T
  for (size_t i = 0; i < v.rows; ++i) {
    const size_t len = v.rowLength(i), off = i * v.stride();
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

// E -= P Qt^T over a view (Qt: k x v.cols, row stride qld): the residual of a rank's own factors.
// kBlock rows at a time, by runs of kRun columns: each run of Qt is read once per kBlock rows (as
// pass 1 reads it), the rows' low-rank part built in L1 and subtracted once.
void subtractLowRank(float* __restrict e, const MatrixView& v, const float* __restrict p,
                     const float* __restrict qt, size_t qld, int k) {
  constexpr size_t kRun = 256;
  alignas(64) float a[kBlock][kRun];
  const size_t full = v.fullRows();
  size_t i = 0;
  for (; i + kBlock <= full; i += kBlock) {
    const float* pi = p + i * k;
    for (size_t c0 = 0; c0 < v.cols; c0 += kRun) {
      const size_t w = std::min(kRun, v.cols - c0);
      for (int b = 0; b < kBlock; ++b) std::fill_n(a[b], w, 0.f);
      for (int j = 0; j < k; ++j) {
        const float p0 = pi[j], p1 = pi[k + j], p2 = pi[2 * k + j], p3 = pi[3 * k + j];
        const float* __restrict q = qt + size_t(j) * qld + c0;
        float* __restrict a0 = a[0];
        float* __restrict a1 = a[1];
        float* __restrict a2 = a[2];
        float* __restrict a3 = a[3];
#pragma omp simd
        for (size_t c = 0; c < w; ++c) {
          a0[c] += p0 * q[c];
          a1[c] += p1 * q[c];
          a2[c] += p2 * q[c];
          a3[c] += p3 * q[c];
        }
      }
      for (int b = 0; b < kBlock; ++b) {
        float* __restrict er = e + (i + b) * v.stride() + c0;
        const float* __restrict ab = a[b];
#pragma omp simd
        for (size_t c = 0; c < w; ++c) er[c] -= ab[c];
      }
    }
  }
  // The last rows one at a time (a padded view's partial row too), with the same additions in the
  // same order: a row's residual has the same bits whichever tile or block it falls in.
  for (; i < v.rows; ++i) {
    const size_t len = v.rowLength(i);
    if (len == 0) break;
    float* __restrict er = e + i * v.stride();
    for (size_t c0 = 0; c0 < len; c0 += kRun) {
      const size_t w = std::min(kRun, len - c0);
      float* __restrict a0 = a[0];
      std::fill_n(a0, w, 0.f);
      for (int j = 0; j < k; ++j) {
        const float pij = p[i * k + j];
        const float* __restrict q = qt + size_t(j) * qld + c0;
#pragma omp simd
        for (size_t c = 0; c < w; ++c) a0[c] += pij * q[c];
      }
#pragma omp simd
      for (size_t c = 0; c < w; ++c) er[c0 + c] -= a0[c];
    }
  }
}

// Rows [r0, r0 + rows) or columns [c0, c0 + cols) of a view, as a view of their own (its
// elements start at r0 * stride, or c0, of the parent's).
MatrixView rowsOf(const MatrixView& v, size_t r0, size_t rows) {
  MatrixView s = v;
  const size_t skip = r0 * v.stride();
  s.ld = v.stride();
  s.rows = rows;
  s.valid = v.valid > skip ? v.valid - skip : 0;
  return s;
}
MatrixView colsOf(const MatrixView& v, size_t c0, size_t cols) {
  MatrixView s = v;
  s.ld = v.stride();
  s.cols = cols;
  s.valid = v.valid > c0 ? v.valid - c0 : 0;
  return s;
}

// Bytes of M a tile of the fused alternating passes holds, so that its second sweep (the
// residual) reads it from cache: the step then moves 12 bytes per element, as one pass.
constexpr size_t kTileBytes = 1 << 20;

template <typename T>
size_t stepP(const T* g, float* e, const MatrixView& v, const float* qt, int k, float* p,
             float limit, lowrankDataType_t wire) {
  if (!e) return pass1(g, e, v, qt, k, p, limit);  // no residual to keep
  const size_t tile = std::max<size_t>(kBlock, kTileBytes / (sizeof(float) * v.cols) / kBlock * kBlock);
  size_t bad = 0;
  for (size_t r0 = 0; r0 < v.rows; r0 += tile) {
    const MatrixView s = rowsOf(v, r0, std::min(tile, v.rows - r0));
    if (s.valid == 0) break;
    const size_t at = r0 * v.stride();
    bad += pass1(g + at, e + at, s, qt, k, p + r0 * k, limit);
    roundTo(wire, p + r0 * k, s.rows * size_t(k));  // as the send will: the residual keeps it
    subtractLowRank(e + at, s, p + r0 * k, qt, v.cols, k);
  }
  return bad;
}

template <typename T>
size_t stepQ(const T* g, float* e, const MatrixView& v, const float* p, int k, float* qt,
             float limit, lowrankDataType_t wire) {
  const uint32_t lim = limitBits(limit);
  size_t bad = 0;
  if (!e) {
    pass2<T, true>(g, e, v, p, k, qt, &bad, lim);
    return bad;
  }
  // Column tiles of at least 64 columns (whole cache lines), fewer rows' worth when n is large.
  const size_t width = std::max<size_t>(64, kTileBytes / (sizeof(float) * std::max<size_t>(v.rows, 1)) / 16 * 16);
  std::vector<float> part(size_t(k) * std::min(width, v.cols));
  for (size_t c0 = 0; c0 < v.cols; c0 += width) {
    const size_t w = std::min(width, v.cols - c0);
    const MatrixView s = colsOf(v, c0, w);
    if (s.valid == 0) break;
    pass2<T, true>(g + c0, e + c0, s, p, k, part.data(), &bad, lim);
    roundTo(wire, part.data(), size_t(k) * w);
    subtractLowRank(e + c0, s, p, part.data(), w, k);
    for (int j = 0; j < k; ++j)
      std::copy_n(part.data() + size_t(j) * w, w, qt + size_t(j) * v.cols + c0);
  }
  return bad;
}

}  // namespace

size_t alternateStepP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* qt, int k, float* p, float limit, lowrankDataType_t wire) {
  switch (dtype) {
    case lowrankFloat16: return stepP(static_cast<const half_t*>(g), e, v, qt, k, p, limit, wire);
    case lowrankBfloat16: return stepP(static_cast<const bf16_t*>(g), e, v, qt, k, p, limit, wire);
    default: return stepP(static_cast<const float*>(g), e, v, qt, k, p, limit, wire);
  }
}

size_t alternateStepQ(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* p, int k, float* qt, float limit, lowrankDataType_t wire) {
  switch (dtype) {
    case lowrankFloat16: return stepQ(static_cast<const half_t*>(g), e, v, p, k, qt, limit, wire);
    case lowrankBfloat16: return stepQ(static_cast<const bf16_t*>(g), e, v, p, k, qt, limit, wire);
    default: return stepQ(static_cast<const float*>(g), e, v, p, k, qt, limit, wire);
  }
}

size_t errorFeedbackAndP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                         const float* qt, int k, float* p, float limit) {
  switch (dtype) {
    case lowrankFloat16: return pass1(static_cast<const half_t*>(g), e, v, qt, k, p, limit);
    case lowrankBfloat16: return pass1(static_cast<const bf16_t*>(g), e, v, qt, k, p, limit);
    default: return pass1(static_cast<const float*>(g), e, v, qt, k, p, limit);
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
