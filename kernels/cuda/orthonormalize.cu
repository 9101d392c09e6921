// Orthonormalization of every matrix of a table, in float64: a multi-block CholeskyQR2 for tall
// matrices with k <= 32 and cuSOLVER's QR for wider ones (both below), else one CUDA block per
// matrix:
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
#include "kernels/cuda/dense_qr.h"
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

// Element idx of matrix d as (r, j): the index walks the storage in order where a stride is 1.
__device__ __forceinline__ void elementOf(const OrthoDesc& d, uint64_t idx, uint64_t* r,
                                         uint64_t* j) {
  const bool rowMajor = d.colStride == 1;
  *r = rowMajor ? idx / d.k : idx % d.n;
  *j = rowMajor ? idx % d.k : idx / d.n;
}

__global__ void __launch_bounds__(kOrthoThreads)
    orthoKernel(const OrthoDesc* __restrict mats, const uint64_t* __restrict wsOff,
                const uint64_t* __restrict flagOff, float* __restrict base, double* __restrict ws,
                double eps) {
  __shared__ SumScratch sh;
  // A matrix of the multi-block path is done here only when that path flagged it.
  // A dense-QR matrix never is.
  const uint64_t fo = flagOff[blockIdx.x];
  if (fo == kSkipMatrix || (fo != kNoFlag && ws[fo] == 0)) return;
  const OrthoDesc d = mats[blockIdx.x];
  const uint64_t n = d.n;
  const uint32_t k = d.k;
  if (k == 0 || n == 0) return;
  double* a = ws + wsOff[blockIdx.x];
  float* m = base + d.offset;
  const uint64_t count = n * k;
  for (uint64_t idx = threadIdx.x; idx < count; idx += kOrthoThreads) {
    uint64_t r, j;
    elementOf(d, idx, &r, &j);
    a[j * n + r] = m[r * d.rowStride + j * d.colStride];
  }
  __syncthreads();
  if (k <= 2)
    gramSchmidt(a, n, k, eps, sh);
  else
    householder(a, a + count, a + 2 * count, n, k, sh);
  __syncthreads();
  for (uint64_t idx = threadIdx.x; idx < count; idx += kOrthoThreads) {
    uint64_t r, j;
    elementOf(d, idx, &r, &j);
    m[r * d.rowStride + j * d.colStride] = float(a[j * n + r]);
  }
}

// ---------------------------------------------------------------------------------------------
// Multi-block path: CholeskyQR2 in float64 (Fukaya et al. 2014) for tall matrices with k <= 32.
//   pass s = 0, 1: G = B^T B (B = A for s = 0, A R1^-1 for s = 1: formed in shared memory, never
//   stored), by Gram tiles of kMultiTileRows rows, partial Grams to the workspace, summed in tile
//   order by cholKernel (deterministic); then G = L L^T (R = L^T) and R^-1, in one CUDA block.
//   Then A = A (R1^-1 R2^-1) D in one sweep from the float32 input.
// Equal to the host twin: for k > 2 the host's Householder Q is the Cholesky Q up to column signs
// D; those signs are those of the Householder reconstruction (Ballard et al. 2015): the LU of
// Q1 D - I (Q1 the top k x k block of Q) with each pivot chosen away from zero, which needs Q1
// only. For k <= 2 (Gram-Schmidt) D = 1 and column j is scaled by r_jj / (r_jj + eps), as the
// host's column / (norm + eps). A pivot of G at or below kRankTol of its diagonal element
// (dependent, zero or nearly dependent column) or a non-finite G sets the matrix's flag in device
// memory: every later kernel skips the matrix and orthoKernel does it the one-block way, exactly
// as the host (zero and dependent columns never give NaN).
constexpr double kRankTol = 1e-12;  // sin^2 of a column's angle to the previous ones: kappa ~1e6

// Rows [r0, r0 + nr) of matrix d into s (T x (K + 1) doubles), zeros elsewhere.
template <int K, int T>
__device__ __forceinline__ void loadChunk(const OrthoDesc& d, const float* __restrict base,
                                          uint64_t r0, int nr, double* s) {
  const float* m = base + d.offset;
  const int k = int(d.k);
  const bool rowMajor = d.colStride == 1;
  for (int idx = threadIdx.x; idx < T * K; idx += kMultiThreads) {
    const int r = rowMajor ? idx / K : idx % T, c = rowMajor ? idx % K : idx / T;
    s[r * (K + 1) + c] =
        r < nr && c < k ? double(m[(r0 + r) * d.rowStride + uint64_t(c) * d.colStride]) : 0.0;
  }
}

template <int K>
struct MultiShape {
  static constexpr int T = multiChunk(K);            // rows staged at once
  static constexpr int B = K < 4 ? K : 4;            // register block (B x B of G, 1 x B of A R)
  static constexpr int kPerG = (K / B) * (K / B);    // threads per Gram
  static constexpr int kGroups = kMultiThreads / kPerG;  // row groups (summed in order)
  static constexpr int kLd = K + 1;
};

template <int K>
__global__ void __launch_bounds__(kMultiThreads)
    gramKernel(const OrthoMulti* __restrict multi, const uint64_t* __restrict prefix,
               uint32_t nMulti, const float* __restrict base, double* __restrict ws, int stage) {
  using S = MultiShape<K>;
  constexpr int T = S::T, B = S::B, L = S::kLd;
  __shared__ union {
    struct {
      double a[T * L];
      double q[T * L];
    } in;
    double part[S::kGroups * K * K];
  } sh;
  __shared__ double sR[K][K];
  __shared__ double sSub[kMultiThreads];
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nMulti, tile);
  const OrthoMulti& x = multi[b];
  if (stage == 1 && ws[x.flag] != 0) return;  // uniform over the block
  const int k = int(x.d.k);
  const uint64_t local = tile - prefix[b];
  const uint64_t rBegin = local * kMultiTileRows;
  const uint64_t rEnd = min(x.d.n, rBegin + kMultiTileRows);
  if (stage == 1)
    for (int idx = threadIdx.x; idx < K * K; idx += kMultiThreads) {
      const int i = idx / K, c = idx % K;
      sR[i][c] = i < k && c < k ? ws[x.rinv1 + i * k + c] : 0.0;
    }

  const int gi = threadIdx.x % S::kPerG, grp = threadIdx.x / S::kPerG;
  const int bi = (gi / (K / B)) * B, bj = (gi % (K / B)) * B;
  double acc[B][B];
#pragma unroll
  for (int u = 0; u < B; ++u)
#pragma unroll
    for (int v = 0; v < B; ++v) acc[u][v] = 0;

  for (uint64_t r0 = rBegin; r0 < rEnd; r0 += T) {
    const int nr = int(min(uint64_t(T), rEnd - r0));
    __syncthreads();  // the previous chunk's readers are done
    loadChunk<K, T>(x.d, base, r0, nr, sh.in.a);
    __syncthreads();
    const double* src = sh.in.a;
    if (stage == 1) {  // q = a R1^-1 (upper triangular), 1 x B per work item
      for (int item = threadIdx.x; item < T * (K / B); item += kMultiThreads) {
        const int r = item % T, c0 = (item / T) * B;
        double q[B];
#pragma unroll
        for (int u = 0; u < B; ++u) q[u] = 0;
        for (int l = 0; l < c0 + B; ++l) {
          const double a = sh.in.a[r * L + l];
#pragma unroll
          for (int u = 0; u < B; ++u) q[u] = fma(a, sR[l][c0 + u], q[u]);
        }
#pragma unroll
        for (int u = 0; u < B; ++u) sh.in.q[r * L + c0 + u] = q[u];
      }
      __syncthreads();
      src = sh.in.q;
    }
    for (int r = grp; r < nr; r += S::kGroups) {
      double ai[B], aj[B];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        ai[u] = src[r * L + bi + u];
        aj[u] = src[r * L + bj + u];
      }
#pragma unroll
      for (int u = 0; u < B; ++u)
#pragma unroll
        for (int v = 0; v < B; ++v) acc[u][v] = fma(ai[u], aj[v], acc[u][v]);
    }
  }
  __syncthreads();  // part overlaps the staged rows
#pragma unroll
  for (int u = 0; u < B; ++u)
#pragma unroll
    for (int v = 0; v < B; ++v) sh.part[(grp * K + bi + u) * K + bj + v] = acc[u][v];
  __syncthreads();
  // The groups' sums in a fixed order: nsub threads per entry take every nsub-th group, then
  // their sums are added in order.
  const int kk = k * k;
  const int nsub = kk <= kMultiThreads ? min(kMultiThreads / kk, S::kGroups) : 1;
  if (nsub > 1) {
    const int t = threadIdx.x;
    double s = 0;
    if (t < nsub * kk) {
      const int e = t % kk, sub = t / kk, i = e / k, j = e % k;
      for (int g = sub; g < S::kGroups; g += nsub) s += sh.part[(g * K + i) * K + j];
    }
    sSub[t] = s;
    __syncthreads();
    if (t < kk) {
      double g = 0;
      for (int sub = 0; sub < nsub; ++sub) g += sSub[sub * kk + t];
      ws[x.partial + local * kk + t] = g;
    }
  } else {
    for (int e = threadIdx.x; e < kk; e += kMultiThreads) {
      const int i = e / k, j = e % k;
      double s = 0;
      for (int g = 0; g < S::kGroups; ++g) s += sh.part[(g * K + i) * K + j];
      ws[x.partial + local * kk + e] = s;
    }
  }
}

// The column signs D that make Q D the host's Householder Q, for any Q with orthonormal columns
// spanning the same nested subspaces (Ballard et al. 2015, Householder reconstruction): the LU of
// Q1 D - I without pivoting, Q1 the top k x k block of Q, each d_j chosen so that the pivot
// d_j x_jj - 1 is away from zero (host: x >= 0 gives alpha = -|x|, a negative diagonal of R). Only
// X's trailing part changes: column c of Q1 D - I is d_c X[:, c] - e_c, and the e_c part is
// untouched until step c. x: Q1 at x[i * ld + c], overwritten; d: k signs. Every thread of the
// block (Threads of them) calls; d is complete when it returns.
// A pivot entry x_jj at rounding level of zero (a zero row of the matrix, e.g. of an embedding's
// gradient) says nothing: the host then takes alpha = -|x|, so d_j makes the diagonal of R
// negative, from rdiag (R's diagonal for Q, as geqrf leaves it), or, with rdiag null, for a Q with
// R's diagonal positive (CholeskyQR).
constexpr double kSignTie = 1e-10;
template <int Threads>
__device__ __forceinline__ void householderSigns(double* x, int ld, int k, double* d,
                                                 const double* rdiag) {
  const int t = threadIdx.x;
  for (int j = 0; j < k; ++j) {
    const double xjj = x[j * ld + j];
    const double dj = fabs(xjj) < kSignTie ? (rdiag && rdiag[j] < 0 ? 1.0 : -1.0)
                                           : xjj >= 0 ? -1.0 : 1.0;
    const double piv = dj * xjj - 1.0;
    if (t == 0) d[j] = dj;
    const int mm = k - j - 1;
    for (int e = t; e < mm * mm; e += Threads) {
      const int r = j + 1 + e / mm, c = j + 1 + e % mm;
      x[r * ld + c] -= (dj * x[r * ld + j] / piv) * x[j * ld + c];
    }
    __syncthreads();
  }
}

// One CUDA block per matrix: G from the partials, Cholesky, R^-1; pass 1 also the signs.
__global__ void __launch_bounds__(kCholThreads)
    cholKernel(const OrthoMulti* __restrict multi, const float* __restrict base,
               double* __restrict ws, int stage, double eps) {
  constexpr int N = kMultiMaxK;
  __shared__ double sG[N][N + 1], sX[N][N + 1], sW[N][N + 1];
  __shared__ double sPart[kCholThreads];
  __shared__ double sDiag[N], sD[N];
  __shared__ int bad;
  const OrthoMulti& x = multi[blockIdx.x];
  if (stage == 1 && ws[x.flag] != 0) return;
  const int t = threadIdx.x;
  const int k = int(x.d.k), kk = k * k;
  const uint64_t tiles = x.tiles;
  const double* part = ws + x.partial;
  if (kk <= kCholThreads) {  // several threads per entry, each over every nsub-th tile
    const int nsub = kCholThreads / kk;
    double s = 0;
    if (t < nsub * kk) {
      const int e = t % kk, sub = t / kk;
#pragma unroll 8
      for (uint64_t tl = sub; tl < tiles; tl += nsub) s += part[tl * kk + e];
    }
    sPart[t] = s;
    __syncthreads();
    if (t < kk) {
      double g = 0;
      for (int sub = 0; sub < nsub; ++sub) g += sPart[sub * kk + t];
      sG[t / k][t % k] = g;
    }
  } else {
    for (int e = t; e < kk; e += kCholThreads) {
      double s = 0;
#pragma unroll 8
      for (uint64_t tl = 0; tl < tiles; ++tl) s += part[tl * kk + e];
      sG[e / k][e % k] = s;
    }
  }
  if (t == 0) bad = 0;
  __syncthreads();
  if (t < k) sDiag[t] = sG[t][t];
  __syncthreads();
  // G = L L^T, L in the lower triangle of sG.
  for (int j = 0; j < k; ++j) {
    if (t == 0) {
      double p = sG[j][j];
      if (!(p > kRankTol * sDiag[j]) || !(p < INFINITY)) {
        bad = 1;
        p = 1;
      }
      sG[j][j] = sqrt(p);
    }
    __syncthreads();
    if (t > j && t < k) sG[t][j] /= sG[j][j];
    __syncthreads();
    const int m = k - j - 1;
    for (int e = t; e < m * m; e += kCholThreads) {
      const int r = j + 1 + e / m, c = j + 1 + e % m;
      if (c <= r) sG[r][c] -= sG[r][j] * sG[c][j];
    }
    __syncthreads();
  }
  if (bad) {  // uniform: read after the barrier
    if (t == 0) ws[x.flag] = 1;
    return;
  }
  // X = R^-1 (R = L^T upper triangular): column c by thread c, back substitution.
  if (t < k) {
    const int c = t;
    for (int i = k - 1; i >= 0; --i) {
      if (i > c) {
        sX[i][c] = 0;
        continue;
      }
      double s = i == c ? 1.0 : 0.0;
      for (int l = i + 1; l <= c; ++l) s -= sG[l][i] * sX[l][c];
      sX[i][c] = s / sG[i][i];
    }
  }
  __syncthreads();
  if (stage == 0) {
    for (int e = t; e < kk; e += kCholThreads) ws[x.rinv1 + e] = sX[e / k][e % k];
    if (t == 0) ws[x.flag] = 0;
    return;
  }
  // Rinv = R1^-1 R2^-1 (upper triangular), into sG.
  for (int e = t; e < kk; e += kCholThreads) sW[e / k][e % k] = ws[x.rinv1 + e];
  __syncthreads();
  double r[ceilDiv(N * N, kCholThreads)];
#pragma unroll
  for (int u = 0; u < int(ceilDiv(N * N, kCholThreads)); ++u) {
    const int e = t + u * kCholThreads;
    double s = 0;
    if (e < kk) {
      const int i = e / k, c = e % k;
      for (int l = i; l <= c; ++l) s += sW[i][l] * sX[l][c];
    }
    r[u] = s;
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < int(ceilDiv(N * N, kCholThreads)); ++u) {
    const int e = t + u * kCholThreads;
    if (e < kk) sG[e / k][e % k] = r[u];
  }
  __syncthreads();
  if (k <= 2) {  // Gram-Schmidt: column / (norm + eps); Rinv_jj = 1 / r_jj
    if (t < k) sD[t] = 1.0 / (1.0 + eps * sG[t][t]);
  } else {
    // Q1 = the top k rows of A Rinv, into sX.
    const float* m = base + x.d.offset;
    for (int e = t; e < kk; e += kCholThreads) {
      const int i = e / k, c = e % k;
      double s = 0;
      for (int l = 0; l <= c; ++l)
        s += double(m[uint64_t(i) * x.d.rowStride + uint64_t(l) * x.d.colStride]) * sG[l][c];
      sX[i][c] = s;
    }
    __syncthreads();
    householderSigns<kCholThreads>(&sX[0][0], N + 1, k, sD, nullptr);
  }
  __syncthreads();
  for (int e = t; e < kk; e += kCholThreads) {
    const int i = e / k, c = e % k;
    ws[x.rinv + e] = sG[i][c] * sD[c];
  }
}

// A = A Rinv over Gram tiles (each chunk staged in shared memory before it is overwritten).
template <int K>
__global__ void __launch_bounds__(kMultiThreads)
    applyKernel(const OrthoMulti* __restrict multi, const uint64_t* __restrict prefix,
                uint32_t nMulti, float* __restrict base, const double* __restrict ws) {
  using S = MultiShape<K>;
  constexpr int T = S::T, L = S::kLd;
  __shared__ double sA[T * L];
  __shared__ double sR[K][K];
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nMulti, tile);
  const OrthoMulti& x = multi[b];
  if (ws[x.flag] != 0) return;
  const int k = int(x.d.k);
  const uint64_t local = tile - prefix[b];
  const uint64_t rBegin = local * kMultiTileRows;
  const uint64_t rEnd = min(x.d.n, rBegin + kMultiTileRows);
  for (int idx = threadIdx.x; idx < K * K; idx += kMultiThreads) {
    const int i = idx / K, c = idx % K;
    sR[i][c] = i < k && c < k ? ws[x.rinv + i * k + c] : 0.0;
  }
  float* m = base + x.d.offset;
  const bool rowMajor = x.d.colStride == 1;
  for (uint64_t r0 = rBegin; r0 < rEnd; r0 += T) {
    const int nr = int(min(uint64_t(T), rEnd - r0));
    __syncthreads();
    loadChunk<K, T>(x.d, base, r0, nr, sA);
    __syncthreads();
    for (int idx = threadIdx.x; idx < T * K; idx += kMultiThreads) {
      const int r = rowMajor ? idx / K : idx % T, c = rowMajor ? idx % K : idx / T;
      if (r >= nr || c >= k) continue;
      double s = 0;
      for (int l = 0; l <= c; ++l) s = fma(sA[r * L + l], sR[l][c], s);
      m[(r0 + r) * x.d.rowStride + uint64_t(c) * x.d.colStride] = float(s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dense-QR path (k > kMultiMaxK): cuSOLVER's Householder QR in float64 (geqrf, then orgqr for the
// thin Q) on the column-major copy; then each column is given the host's sign (householderSigns,
// with R's diagonal as geqrf left it). Equal to the host twin for full-rank matrices; for a
// rank-deficient one, both give orthonormal columns with no NaN, but the columns past the rank
// may differ (any completion). The copies in and out take denseSlices CUDA blocks per matrix.

// The matrices, float32 -> float64 column-major.
__global__ void __launch_bounds__(kOrthoThreads)
    denseLoadKernel(const OrthoDense* __restrict dense, uint32_t slices,
                    const float* __restrict base, double* __restrict ws) {
  const OrthoDense x = dense[blockIdx.x / slices];
  const uint64_t count = x.d.n * x.d.k, step = uint64_t(slices) * kOrthoThreads;
  const float* m = base + x.d.offset;
  double* a = ws + x.a;
  for (uint64_t idx = (blockIdx.x % slices) * uint64_t(kOrthoThreads) + threadIdx.x; idx < count;
       idx += step) {
    uint64_t r, j;
    elementOf(x.d, idx, &r, &j);
    a[j * x.d.n + r] = m[r * x.d.rowStride + j * x.d.colStride];
  }
}

// After geqrf: R's diagonal, before orgqr overwrites it.
__global__ void __launch_bounds__(kOrthoThreads)
    denseDiagKernel(const OrthoDense* __restrict dense, double* __restrict ws) {
  const OrthoDense x = dense[blockIdx.x];
  for (uint64_t j = threadIdx.x; j < x.d.k; j += kOrthoThreads)
    ws[x.rdiag + j] = ws[x.a + j * x.d.n + j];
}

// After orgqr: the column signs D from Q's top k x k block (into tau's place: tau is spent).
__global__ void __launch_bounds__(kOrthoThreads)
    denseSignKernel(const OrthoDense* __restrict dense, double* __restrict ws) {
  const OrthoDense x = dense[blockIdx.x];
  const uint64_t n = x.d.n;
  const int k = int(x.d.k);  // k * k <= n * k < 2^31 (denseQrOrtho)
  const double* a = ws + x.a;
  double* q1 = ws + x.q1;
  for (int e = threadIdx.x; e < k * k; e += kOrthoThreads) q1[e] = a[uint64_t(e % k) * n + e / k];
  __syncthreads();
  householderSigns<kOrthoThreads>(q1, k, k, ws + x.tau, ws + x.rdiag);
}

// Q D back to float32.
__global__ void __launch_bounds__(kOrthoThreads)
    denseStoreKernel(const OrthoDense* __restrict dense, uint32_t slices, float* __restrict base,
                     const double* __restrict ws) {
  const OrthoDense x = dense[blockIdx.x / slices];
  const uint64_t count = x.d.n * x.d.k, step = uint64_t(slices) * kOrthoThreads;
  const double* a = ws + x.a;
  const double* d = ws + x.tau;
  float* m = base + x.d.offset;
  for (uint64_t idx = (blockIdx.x % slices) * uint64_t(kOrthoThreads) + threadIdx.x; idx < count;
       idx += step) {
    uint64_t r, j;
    elementOf(x.d, idx, &r, &j);
    m[r * x.d.rowStride + j * x.d.colStride] = float(a[j * x.d.n + r] * d[j]);
  }
}

cudaError_t denseQr(const OrthoTable* t, float* base, cudaStream_t stream) {
  const DenseQrApi* api = denseQrApi();
  const uint64_t nd = t->denseHost.size();
  const auto* dense = static_cast<const OrthoDense*>(t->dense);
  cudaError_t e = launch(denseLoadKernel, nd * t->denseSlices, kOrthoThreads, stream, dense,
                         t->denseSlices, static_cast<const float*>(base), t->ws);
  if (e != cudaSuccess) return e;
  if (api->setStream(t->solver, stream) != 0) return cudaErrorUnknown;
  bool ok = true;
  for (const OrthoDense& x : t->denseHost) {
    const int n = int(x.d.n), k = int(x.d.k);
    ok = ok && api->geqrf(t->solver, n, k, t->ws + x.a, n, t->ws + x.tau, t->solverWork,
                          t->solverLwork, t->solverInfo) == 0;
  }
  if (ok) e = launch(denseDiagKernel, nd, kOrthoThreads, stream, dense, t->ws);
  for (const OrthoDense& x : t->denseHost) {
    const int n = int(x.d.n), k = int(x.d.k);
    ok = ok && e == cudaSuccess &&
         api->orgqr(t->solver, n, k, k, t->ws + x.a, n, t->ws + x.tau, t->solverWork,
                    t->solverLwork, t->solverInfo) == 0;
  }
  // Back to the default stream: the handle must not keep the caller's stream, which may be
  // destroyed before the table is.
  api->setStream(t->solver, nullptr);
  if (e != cudaSuccess) return e;
  if (!ok) return cudaErrorUnknown;
  e = launch(denseSignKernel, nd, kOrthoThreads, stream, dense, t->ws);
  if (e != cudaSuccess) return e;
  return launch(denseStoreKernel, nd * t->denseSlices, kOrthoThreads, stream, dense,
                t->denseSlices, base, static_cast<const double*>(t->ws));
}

}  // namespace

cudaError_t orthonormalize(const OrthoTable* t, float* base, double eps, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->n == 0) return cudaSuccess;
  if (t->nMulti) {
    const cudaError_t err = withBucket(t->bucket, [&](auto bucket) {
      constexpr int K = decltype(bucket)::value;
      cudaError_t e = cudaSuccess;
      for (int stage = 0; stage < 2 && e == cudaSuccess; ++stage) {
        e = launch(gramKernel<K>, t->multiTiles, kMultiThreads, stream, t->multi, t->multiPrefix,
                   t->nMulti, static_cast<const float*>(base), t->ws, stage);
        if (e == cudaSuccess)
          e = launch(cholKernel, t->nMulti, kCholThreads, stream, t->multi,
                     static_cast<const float*>(base), t->ws, stage, eps);
      }
      if (e == cudaSuccess)
        e = launch(applyKernel<K>, t->multiTiles, kMultiThreads, stream, t->multi,
                   t->multiPrefix, t->nMulti, base, static_cast<const double*>(t->ws));
      return e;
    });
    if (err != cudaSuccess) return err;
  }
  if (!t->denseHost.empty())
    if (const cudaError_t err = denseQr(t, base, stream); err != cudaSuccess) return err;
  return launch(orthoKernel, t->n, kOrthoThreads, stream, t->mats, t->wsOff, t->flagOff, base,
                t->ws, eps);
}

}  // namespace lowrank::cuda
