#include "kernels/host/powersgd_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "util/convert.h"
#include "util/env.h"
#include "util/log.h"

// The element-wise passes' table, one per instruction set (elementwise_impl.h).
namespace lowrank::host {
struct ElementwisePasses {
  // Q = M^T P (pass 2); add: M = G + E first, E += G in place, returning the count of elements
  // beyond `limit` (the alternating Q step).
  size_t (*qOfRows)(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                    const float* p, int k, float* qt, bool add, float limit);
  // Pass 3: out = s P Qbar^T, and E -= P Qbar^T when e is not null.
  void (*decompress)(float* e, const MatrixView& v, const float* p, const float* qbart, int k,
                     float s, void* out, lowrankDataType_t dtype);
  // E -= P Qt^T (Qt at row stride qld), products summed from 0.
  void (*residual)(float* e, const MatrixView& v, const float* p, const float* qt, size_t qld,
                   int k);
  // The alternating P step's first sweep: E += G (counting elements beyond `limit`), P = M Qt^T,
  // its dot products in 8 lanes in a fixed order (the same bits under every instruction set).
  // pendingQt (with e only): the last Q step's residual first (E -= P pendingQt^T, P in p:
  // sweepRowsOfM).
  size_t (*pOfRows)(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                    const float* qt, int k, float* p, float limit, const float* pendingQt);
  // The whole alternating P step after a Q step that left its residual (pendingQt), k <= 8, with
  // E: pOfRows' results, P rounded to `wire`, then E -= P Qt^T, a few rows at a time (the bits of
  // pOfRows, roundTo and residual over the view).
  size_t (*pStepAfterQ)(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                        const float* qt, int k, float* p, float limit, const float* pendingQt,
                        lowrankDataType_t wire);
};
}  // namespace lowrank::host

// AVX2 for the element-wise passes where GCC compiles for x86-64 (a target pragma; clang has none).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOWRANK_HOST_AVX2 1
#else
#define LOWRANK_HOST_AVX2 0
#endif

#define LR_ISA baseline
#include "kernels/host/elementwise_impl.h"
#undef LR_ISA
#if LOWRANK_HOST_AVX2
#pragma GCC push_options
#pragma GCC target("avx2")
#define LR_ISA avx2
#include "kernels/host/elementwise_impl.h"
#undef LR_ISA
#pragma GCC pop_options
#endif

namespace lowrank::host {
namespace {

using baseline::kBlock;
using baseline::limitBits;

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

// Pass 1: its dot products sum across the vector's lanes, in an order that follows the vector
// width, so it runs the baseline's code on every machine (the same bits everywhere).
template <typename T>
size_t pass1(const T* g, float* e, const MatrixView& v, const float* __restrict qt, int k,
             float* p, float limit) {
  auto block = [&](const float* const* m, float* __restrict pi) {
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
      pi[0 * k + j] = a0;
      pi[1 * k + j] = a1;
      pi[2 * k + j] = a2;
      pi[3 * k + j] = a3;
    }
  };
  auto row = [&](const float* mi, size_t len, float* pi) {
    for (int j = 0; j < k; ++j) pi[j] = dot(mi, qt + size_t(j) * v.cols, len);
  };
  return baseline::sweepRowsOfM(g, e, v, k, p, limitBits(limit), block, row);
}

// Bytes of M a row tile of the alternating P step holds, so that its second sweep (the residual)
// reads it from cache: the P step then moves 12 bytes per element, as one pass.
constexpr size_t kTileBytes = 1 << 19;

// The table of the instruction set in force (hostIsa): chosen once, at the first call, from
// LOWRANK_HOST_ISA (a bad value: the best this CPU has, with a warning; lowrankCommInitRank fails
// on it), or set by setHostIsa. Each call reads it once, so a change never splits a call.
const ElementwisePasses& tableOf(HostIsa isa) {
#if LOWRANK_HOST_AVX2
  if (isa == HostIsa::avx2) return avx2::kPasses;
#endif
  (void)isa;
  return baseline::kPasses;
}

std::atomic<int> gIsa{-1};

const ElementwisePasses& passes() {
  int isa = gIsa.load(std::memory_order_acquire);
  if (isa < 0) {
    HostIsa chosen = HostIsa::baseline;
    const Status st = hostIsaFromEnv(&chosen);
    if (!st.ok()) {
      chosen = hostIsaSupported(HostIsa::avx2) ? HostIsa::avx2 : HostIsa::baseline;
      LR_WARN("%s; the host kernels run with %s", st.msg.c_str(), hostIsaName(chosen));
    }
    int unset = -1;
    if (gIsa.compare_exchange_strong(unset, int(chosen), std::memory_order_acq_rel))
      LR_INFO("host kernels: the element-wise passes run with %s", hostIsaName(chosen));
    isa = gIsa.load(std::memory_order_acquire);
  }
  return tableOf(HostIsa(isa));
}

// The alternating P step. Its dot products are pOfRows' (8 fixed lanes, vectorized under AVX2),
// not pass 1's: alternation has no checkpoints from before that kernel to hold its bits.
template <typename T>
size_t stepP(const T* g, lowrankDataType_t dtype, float* e, const MatrixView& v, const float* qt,
             int k, float* p, float limit, lowrankDataType_t wire, const float* pendingQt) {
  const ElementwisePasses& ew = passes();
  if (!e) return ew.pOfRows(g, dtype, e, v, qt, k, p, limit, nullptr);  // no residual to keep
  if (pendingQt && k <= 8) return ew.pStepAfterQ(g, dtype, e, v, qt, k, p, limit, pendingQt, wire);
  const size_t tile = std::max<size_t>(kBlock, kTileBytes / (sizeof(float) * v.cols) / kBlock * kBlock);
  size_t bad = 0;
  for (size_t r0 = 0; r0 < v.rows; r0 += tile) {
    const MatrixView s = v.rowsFrom(r0, std::min(tile, v.rows - r0));
    if (s.valid == 0) break;
    const size_t at = r0 * v.stride();
    // With pendingQt, the last Q step's residual in the same sweep (one read and write of E).
    bad += ew.pOfRows(g + at, dtype, e + at, s, qt, k, p + r0 * k, limit, pendingQt);
    roundTo(wire, p + r0 * k, s.rows * size_t(k));  // as the send will: the residual keeps it
    ew.residual(e + at, s, p + r0 * k, qt, v.cols, k);
  }
  return bad;
}

}  // namespace

const char* hostIsaName(HostIsa isa) { return isa == HostIsa::avx2 ? "avx2" : "baseline"; }

bool hostIsaSupported(HostIsa isa) {
  if (isa == HostIsa::baseline) return true;
#if LOWRANK_HOST_AVX2
  __builtin_cpu_init();  // in case this runs before libgcc's own constructor (a static initializer)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

Status hostIsaFromEnv(HostIsa* out) {
  const char* names[3] = {"auto", "avx2", "baseline"};
  int i = 0;
  LR_RETURN_IF_ERROR(env::choice("LOWRANK_HOST_ISA", names, 3, &i));
  if (i == 2) *out = HostIsa::baseline;
  else if (hostIsaSupported(HostIsa::avx2)) *out = HostIsa::avx2;
  else if (i == 0) *out = HostIsa::baseline;
  else
    return Status::Error(lowrankInvalidUsage,
                         "LOWRANK_HOST_ISA=avx2, but %s (use auto or baseline)",
#if LOWRANK_HOST_AVX2
                         "this CPU has no AVX2"
#else
                         "this build has no AVX2 kernels (not x86-64 GCC)"
#endif
    );
  return Status::Ok();
}

HostIsa hostIsa() {
  passes();  // chooses, if not yet
  return HostIsa(gIsa.load(std::memory_order_acquire));
}

Status setHostIsa(HostIsa isa) {
  if (!hostIsaSupported(isa))
    return Status::Error(lowrankInvalidUsage, "the host kernels cannot run with %s here",
                         hostIsaName(isa));
  gIsa.store(int(isa), std::memory_order_release);
  return Status::Ok();
}

size_t alternateStepP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* qt, int k, float* p, float limit, lowrankDataType_t wire,
                      const float* pendingQt) {
  switch (dtype) {
    case lowrankFloat16:
      return stepP(static_cast<const half_t*>(g), dtype, e, v, qt, k, p, limit, wire, pendingQt);
    case lowrankBfloat16:
      return stepP(static_cast<const bf16_t*>(g), dtype, e, v, qt, k, p, limit, wire, pendingQt);
    default:
      return stepP(static_cast<const float*>(g), dtype, e, v, qt, k, p, limit, wire, pendingQt);
  }
}

void subtractLowRank(float* e, const MatrixView& v, const float* p, const float* qt, size_t qld,
                     int k) {
  passes().residual(e, v, p, qt, qld, k);
}

size_t alternateStepQ(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* p, int k, float* qt, float limit, lowrankDataType_t wire,
                      bool deferResidual) {
  const ElementwisePasses& ew = passes();
  const size_t bad = ew.qOfRows(g, dtype, e, v, p, k, qt, true, limit);
  if (!e) return bad;  // no residual to keep
  // The residual in a second sweep: E -= P Q^T. One sweep by column tiles (all rows of a few
  // columns, kept in cache for the residual) would read 8 fewer bytes per element, but it strides
  // across rows of a few cache lines each, which the prefetchers do not follow: slower than two
  // sequential sweeps at every shape and tile tried (512 x 4608 to 4096 x 4096, tiles of 1 to
  // 16 MiB, with and without software prefetch), by 1.05x to 2.9x (docs/design.md, "Alternating
  // factors").
  roundTo(wire, qt, size_t(k) * v.cols);  // as the send will: the residual keeps it
  if (!deferResidual) ew.residual(e, v, p, qt, v.cols, k);
  return bad;
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
  // without add, pass 2 only reads E
  passes().qOfRows(g, dtype, const_cast<float*>(e), v, p, k, qt, false, INFINITY);
}

void decompressAndUpdateError(float* e, const MatrixView& v, const float* p, const float* qbart,
                              int k, float s, void* out, lowrankDataType_t dtype) {
  passes().decompress(e, v, p, qbart, k, s, out, dtype);
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
