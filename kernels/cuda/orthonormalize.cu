// Orthonormalization of every matrix of a table, one CUDA block per matrix, in float64.
// Host twin: host::orthonormalize (kernels/host/orthonormalize.cc), the same algorithm step by
// step: k <= 2 Gram-Schmidt twice with the same zero / dependent-column rule and epsilon, k > 2
// Householder QR and the thin Q. The only difference is the order of additions (block-wide
// reductions) and that the dot products of one reflector with all columns are done in one sweep
// (they are independent: the same values). Never NaN on zero or dependent columns.
//
// The matrix lives column-major in the table's float64 workspace (n x k, then the k reflectors,
// then k flags). Row r is always touched by thread r % kOrthoThreads, so the only cross-thread
// data are the block sums (every thread gets them) and the flags (written before a barrier).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

constexpr int kOrthoThreads = 512;
constexpr int kOrthoWarps = kOrthoThreads / 32;
constexpr int kDots = 8;  // columns per sweep of dot products

struct SumScratch {
  double partial[kOrthoWarps][kDots];
  double sum[kDots];
};

// Block-wide sums of G doubles per thread; every thread gets them. Fixed order: deterministic.
// All threads must call. Reuse is safe without a third barrier: the next call writes `partial`
// before its first barrier, after every thread has passed this call's last barrier.
template <int G>
__device__ __forceinline__ void blockSum(double (&x)[G], SumScratch& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int o = 16; o > 0; o /= 2) x[g] += __shfl_xor_sync(kFullMask, x[g], o);
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < G; ++g) sh.partial[warp][g] = x[g];
  __syncthreads();
  if (threadIdx.x < G) {
    double s = 0;
    for (int w = 0; w < kOrthoWarps; ++w) s += sh.partial[w][threadIdx.x];
    sh.sum[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < G; ++g) x[g] = sh.sum[g];
}

// First row >= from owned by this thread (rows r with r % kOrthoThreads == threadIdx.x).
__device__ __forceinline__ uint64_t firstOwned(uint64_t from) {
  const uint64_t t = threadIdx.x;
  return from <= t ? t : t + ceilDiv(from - t, kOrthoThreads) * kOrthoThreads;
}

// sum over r >= from of x[r]^2.
__device__ __forceinline__ double sumSquares(const double* x, uint64_t n, uint64_t from,
                                             SumScratch& sh) {
  double s[1] = {0};
  for (uint64_t r = firstOwned(from); r < n; r += kOrthoThreads) s[0] += x[r] * x[r];
  blockSum<1>(s, sh);
  return s[0];
}

// For the columns c in [c0, min(c0 + kDots, k)): y_c[r] -= 2 (v . y_c) v[r] over r >= from.
__device__ __forceinline__ void reflect(double* a, uint64_t n, uint32_t k, uint32_t c0,
                                        const double* v, uint64_t from, SumScratch& sh) {
  double d[kDots];
#pragma unroll
  for (int g = 0; g < kDots; ++g) d[g] = 0;
  for (uint64_t r = firstOwned(from); r < n; r += kOrthoThreads) {
    const double vr = v[r];
#pragma unroll
    for (int g = 0; g < kDots; ++g)
      if (c0 + g < k) d[g] += vr * a[(c0 + g) * n + r];
  }
  blockSum<kDots>(d, sh);
  for (uint64_t r = firstOwned(from); r < n; r += kOrthoThreads) {
    const double vr = v[r];
#pragma unroll
    for (int g = 0; g < kDots; ++g)
      if (c0 + g < k) a[(c0 + g) * n + r] -= 2 * d[g] * vr;
  }
}

// host gramSchmidt: each projection twice; a column whose norm falls to rounding level of what it
// was (dependent) or is zero becomes zero; else column / (norm + eps).
__device__ __forceinline__ void gramSchmidt(double* a, uint64_t n, uint32_t k, double eps,
                                            SumScratch& sh) {
  for (uint32_t j = 0; j < k; ++j) {
    double* c = a + j * n;
    const double before = sqrt(sumSquares(c, n, 0, sh));
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t i = 0; i < j; ++i) {
        const double* b = a + i * n;
        double d[1] = {0};
        for (uint64_t r = firstOwned(0); r < n; r += kOrthoThreads) d[0] += b[r] * c[r];
        blockSum<1>(d, sh);
        for (uint64_t r = firstOwned(0); r < n; r += kOrthoThreads) c[r] -= d[0] * b[r];
      }
    }
    const double after = sqrt(sumSquares(c, n, 0, sh));
    const bool zero = !(after > 1e-12 * before) || after == 0;
    const double inv = zero ? 0.0 : 1.0 / (after + eps);
    for (uint64_t r = firstOwned(0); r < n; r += kOrthoThreads) c[r] = zero ? 0.0 : c[r] * inv;
  }
}

// host householder: reflectors H_j = I - 2 v_j v_j^T (v_j zero above row j, unit norm), skipped
// (flag 0) where the column below the diagonal is zero; then Q = H_0 ... H_{k-1} I[:, :k].
__device__ __forceinline__ void householder(double* a, double* v, double* active, uint64_t n,
                                            uint32_t k, SumScratch& sh) {
  for (uint32_t j = 0; j < k; ++j) {
    const double* x = a + j * n;
    double* vj = v + j * n;
    // |x[j:]|^2 and x[j] (only row j's owner adds it: an exact broadcast) in one reduction.
    double s[2] = {0, 0};
    for (uint64_t r = firstOwned(j); r < n; r += kOrthoThreads) {
      s[0] += x[r] * x[r];
      if (r == j) s[1] = x[r];
    }
    blockSum<2>(s, sh);
    const double nx = sqrt(s[0]);
    if (nx == 0) {  // nothing to reflect: H_j = I
      if (threadIdx.x == 0) active[j] = 0;
      continue;
    }
    const double alpha = s[1] >= 0 ? -nx : nx;
    double t[1] = {0};
    for (uint64_t r = firstOwned(j); r < n; r += kOrthoThreads) {
      const double vr = r == j ? x[r] - alpha : x[r];
      vj[r] = vr;
      t[0] += vr * vr;
    }
    blockSum<1>(t, sh);
    const double nv = sqrt(t[0]);
    if (nv == 0) {
      if (threadIdx.x == 0) active[j] = 0;
      continue;
    }
    for (uint64_t r = firstOwned(j); r < n; r += kOrthoThreads) vj[r] /= nv;
    if (threadIdx.x == 0) active[j] = 1;
    for (uint32_t c0 = j; c0 < k; c0 += kDots) reflect(a, n, k, c0, vj, j, sh);
  }
  for (uint64_t r = firstOwned(0); r < n; r += kOrthoThreads)
    for (uint32_t c = 0; c < k; ++c) a[c * n + r] = r == c ? 1.0 : 0.0;
  __syncthreads();  // the flags, written by thread 0
  for (uint32_t j = k; j-- > 0;) {
    if (active[j] == 0) continue;
    for (uint32_t c0 = 0; c0 < k; c0 += kDots) reflect(a, n, k, c0, v + j * n, j, sh);
  }
}

__global__ void __launch_bounds__(kOrthoThreads)
    orthoKernel(const OrthoDesc* __restrict mats, const uint64_t* __restrict wsOff,
                float* __restrict base, double* __restrict ws, double eps) {
  __shared__ SumScratch sh;
  const OrthoDesc d = mats[blockIdx.x];
  const uint64_t n = d.n;
  const uint32_t k = d.k;
  if (k == 0 || n == 0) return;
  double* a = ws + wsOff[blockIdx.x];
  float* m = base + d.offset;
  // Element (r, j) of the matrix; the loop walks the storage in order where a stride is 1.
  const bool rowMajor = d.colStride == 1;
  const uint64_t count = n * k;
  for (uint64_t idx = threadIdx.x; idx < count; idx += kOrthoThreads) {
    const uint64_t r = rowMajor ? idx / k : idx % n, j = rowMajor ? idx % k : idx / n;
    a[j * n + r] = m[r * d.rowStride + j * d.colStride];
  }
  __syncthreads();
  if (k <= 2)
    gramSchmidt(a, n, k, eps, sh);
  else
    householder(a, a + count, a + 2 * count, n, k, sh);
  __syncthreads();
  for (uint64_t idx = threadIdx.x; idx < count; idx += kOrthoThreads) {
    const uint64_t r = rowMajor ? idx / k : idx % n, j = rowMajor ? idx % k : idx / n;
    m[r * d.rowStride + j * d.colStride] = float(a[j * n + r]);
  }
}

}  // namespace

cudaError_t orthonormalize(const OrthoTable* t, float* base, double eps, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->n == 0) return cudaSuccess;
  return launch(orthoKernel, t->n, kOrthoThreads, stream, t->mats, t->wsOff, base, t->ws, eps);
}

}  // namespace lowrank::cuda
