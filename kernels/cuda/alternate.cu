// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors"): the device twins of
// host::alternateStepP and host::alternateStepQ (kernels/host/powersgd_kernels.cc), and the reset
// of a rejected P step's factor. The decompression is pass 3's (decompressAlternate, pass3.cu).
//
// P step, fused per row (stepPKernel): a CUDA block takes kWarps * rowsPerWarpA(K) whole rows of
// one row block, each warp rowsPerWarpA(K) of them (2, or 1 from K = 16). Sweep 1 streams the
// warp's rows along the columns as pass 1 does (coalesced G and E, Qt through L1): M = G + E
// written into E and counted, P = M Q accumulated in registers and summed across the warp (P's
// row is the warp's alone, so no partial sums and no second launch). Sweep 2 follows at once on
// the same rows: E -= P Q^T, P's row read back by every lane after the warp's barrier, E reread
// where the warp wrote it a moment before (from L2 while the rows in flight fit there: 12 B per
// element of M from DRAM; else the reread costs 8 B more). Not measured on a GPU yet. k > 32 loops over groups of 32 columns of Qt in both sweeps (sweep 1
// re-reads M from E, as pass 1): the slow path.
//
// Q step, two sweeps over column blocks: pass 2 with M = G + E written back and counted
// (computeQCounting, pass2.cu: partial sums by row slabs, reduced in slab order), then
// E -= P Q^T by pass 3's tiles (subtractLowRank, pass3.cu). Q's column needs every row of M
// before the residual can be taken, so the residual is a second launch: 20 B per element of M
// (read G, E; write E; read E; write E).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

template <typename T, int K>
__global__ void __launch_bounds__(kThreads, minBlocks1(K))
    stepPKernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                uint32_t nBlocks, const T* __restrict g, float* __restrict e,
                const float* __restrict qt, float* p, float* nonFinite, int wire) {
  constexpr int RW = rowsPerWarpA(K);
  constexpr int U = stepsPerLoad1(K);
  constexpr int kLanesPerSum = 32 / K;
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock& x = blocks[b];
  const uint64_t offset = x.d.offset, valid = x.d.valid, ld = x.d.ld, qld = x.d.qld;
  const uint64_t rows = x.d.rows, cols = x.d.cols;
  const uint32_t k = x.d.k;
  const uint64_t local = tile - prefix[b];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t i0 = local * (kWarps * RW) + uint64_t(warp) * RW;
  const uint32_t limBits = __float_as_uint(x.d.limit) & 0x7fffffffu;

  // Row r of the warp: its elements at g / e [row[r] + j] for j < len[r] (0: no row).
  uint64_t row[RW];
  int32_t len[RW];
  int32_t longest = 0;
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    const uint64_t i = i0 + r;
    len[r] = i < rows ? int32_t(rowLength(i, ld, cols, valid)) : 0;
    row[r] = len[r] ? offset + i * ld : 0;
    longest = max(longest, len[r]);
  }
  unsigned bad = 0;

  // Sweep 1: M = G + E into E (first group), P = M Q.
  for (uint32_t c0 = 0; c0 < k; c0 += K) {
    const bool first = c0 == 0;
    const float* q = qt + x.d.qt + uint64_t(c0) * qld;
    float acc[RW][K];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < K; ++c) acc[r][c] = 0.f;
    for (int32_t j0 = 0; j0 < longest; j0 += 32 * U) {  // warp-uniform bound
      float gv[U][RW], ev[U][RW];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const int32_t j = j0 + 32 * u + lane;
          const bool in = j < len[r];
          gv[u][r] = first && in ? toF(g[row[r] + j]) : 0.f;  // missing elements count as zeros
          ev[u][r] = in ? e[row[r] + j] : 0.f;
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t j = j0 + 32 * u + lane;
        float v[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          v[r] = first ? gv[u][r] + ev[u][r] : ev[u][r];
          if (first && j < len[r]) {
            e[row[r] + j] = v[r];
            bad += beyond(v[r], limBits);
          }
        }
        const bool qin = j < int32_t(cols);
#pragma unroll
        for (int c = 0; c < K; ++c) {
          const float qv = qin && c0 + c < k ? __ldg(q + uint64_t(c) * qld + j) : 0.f;
#pragma unroll
          for (int r = 0; r < RW; ++r) acc[r][c] = fmaf(v[r], qv, acc[r][c]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const float v = warpTransposeSum<K>(acc[r], lane);
      const uint64_t i = i0 + r;
      const uint32_t c = c0 + lane / kLanesPerSum;
      // 16-bit factors: P as the wire will carry it, so that the residual keeps what it drops.
      if (lane % kLanesPerSum == 0 && c < k && i < rows) p[x.d.p + i * k + c] = roundToWire(v, wire);
    }
  }
  __syncwarp();  // the warp's P rows written, and visible to all its lanes

  // Sweep 2: E -= P Q^T on the same rows, group by group.
  for (uint32_t c0 = 0; c0 < k; c0 += K) {
    const float* q = qt + x.d.qt + uint64_t(c0) * qld;
    float pr[RW][K];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < K; ++c)
        pr[r][c] = len[r] && c0 + c < k ? p[x.d.p + (i0 + r) * k + c0 + c] : 0.f;
    for (int32_t j0 = 0; j0 < longest; j0 += 32 * U) {
      float ev[U][RW];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const int32_t j = j0 + 32 * u + lane;
          ev[u][r] = j < len[r] ? e[row[r] + j] : 0.f;
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t j = j0 + 32 * u + lane;
        float a[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) a[r] = 0.f;
        const bool qin = j < int32_t(cols);
#pragma unroll
        for (int c = 0; c < K; ++c) {
          const float qv = qin && c0 + c < k ? __ldg(q + uint64_t(c) * qld + j) : 0.f;
#pragma unroll
          for (int r = 0; r < RW; ++r) a[r] = fmaf(pr[r][c], qv, a[r]);
        }
#pragma unroll
        for (int r = 0; r < RW; ++r)
          if (j < len[r]) e[row[r] + j] = ev[u][r] - a[r];
      }
    }
  }
  addBlockCount(bad, nonFinite);
}

// 16-bit factors, the Q step: each block's Qt (k x cols at qt + d.qt, row stride qld) rounded in
// place to the wire's dtype before the residual is taken. One CUDA block per block of the table.
__global__ void __launch_bounds__(kThreads)
    roundQKernel(const DevBlock* __restrict blocks, float* __restrict qt, int wire) {
  const BlockDesc d = blocks[blockIdx.x].d;
  const uint64_t cols = d.cols, size = cols * d.k;
  for (uint64_t idx = threadIdx.x; idx < size; idx += kThreads) {
    float& v = qt[d.qt + (idx / cols) * d.qld + idx % cols];
    v = roundToWire(v, wire);
  }
}

// A rejected call's factor replaced by the first k unit vectors (rows r = c of each matrix 1, the
// rest 0): orthonormal and the same on every comm rank. One CUDA block per matrix.
__global__ void __launch_bounds__(kThreads)
    unitFactorKernel(const OrthoDesc* __restrict mats, float* __restrict base,
                     const float* __restrict checks, float expectedOp) {
  if (checks[0] == 0.f && checks[1] == expectedOp) return;
  const OrthoDesc d = mats[blockIdx.x];
  const uint64_t size = d.n * d.k;
  for (uint64_t idx = threadIdx.x; idx < size; idx += kThreads) {
    const uint64_t r = idx / d.k, c = idx % d.k;
    base[d.offset + r * d.rowStride + c * d.colStride] = r == c ? 1.f : 0.f;
  }
}

}  // namespace

cudaError_t alternateStepP(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                           const float* qt, float* p, float* nonFinite, cudaStream_t stream,
                           lowrankDataType_t wire) {
  if (!t) return cudaErrorInvalidValue;
  if (!e) return errorFeedbackAndP(t, g, dtype, e, qt, p, nonFinite, stream);  // no residual
  if (t->total[kTilesA] == 0) return cudaSuccess;
  return withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return withBucket(t->bucket, [&](auto bucket) {
      constexpr int K = decltype(bucket)::value;
      return launch(stepPKernel<T, K>, t->total[kTilesA], kThreads, stream, t->blocks,
                    t->pre(kTilesA), t->n, static_cast<const T*>(g), e, qt, p, nonFinite,
                    int(wire));
    });
  });
}

cudaError_t alternateStepQ(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                           const float* p, float* qt, float* nonFinite, cudaStream_t stream,
                           lowrankDataType_t wire) {
  if (!t) return cudaErrorInvalidValue;
  cudaError_t err = computeQCounting(t, g, dtype, e, p, qt, nonFinite, stream);
  if (err != cudaSuccess || !e) return err;
  if ((wire == lowrankBfloat16 || wire == lowrankFloat16) && t->n) {
    err = launch(roundQKernel, t->n, kThreads, stream, t->blocks, qt, int(wire));
    if (err != cudaSuccess) return err;
  }
  return subtractLowRank(t, e, p, qt, stream);
}

cudaError_t unitFactorIfRejected(const OrthoTable* t, float* base, const float* checks,
                                 float expectedOp, cudaStream_t stream) {
  if (!t || !checks) return cudaErrorInvalidValue;
  if (t->n == 0) return cudaSuccess;
  return launch(unitFactorKernel, t->n, kThreads, stream, t->mats, base, checks, expectedOp);
}

}  // namespace lowrank::cuda
