// Pass 1: fused error-feedback add and P = M Q over every row block of a table.
// Host twin: host::errorFeedbackAndP (kernels/host/powersgd_kernels.cc).
//
// A CUDA block takes a tile of kWarps * RW rows x ct1 columns of one block; each warp owns RW rows
// and streams them along the columns (coalesced G / E), with RW x K accumulators per lane, so each
// Qt element (read through L1: the tile's warps share it) serves RW rows. The lanes' partial dot
// products are summed by a transposed warp reduction; a row split into several column chunks
// leaves one partial P per chunk in the workspace, summed in chunk order by reduce1 (deterministic,
// no float atomics). k > 32 loops over groups of 32 columns of Qt, re-reading M (from E once it
// holds M): the slow path.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

template <typename T, bool kFeedback, int K>
__global__ void __launch_bounds__(kThreads, minBlocks1(K))
    pass1Kernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                uint32_t nBlocks, uint64_t ct, const T* __restrict g, float* __restrict e,
                const float* __restrict qt, float* __restrict p, float* __restrict ws,
                float* nonFinite) {
  constexpr int RW = rowsPerWarp1(K);
  constexpr int U = stepsPerLoad1(K);
  constexpr int kLanesPerSum = 32 / K;
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock& x = blocks[b];
  const uint64_t offset = x.d.offset, valid = x.d.valid, ld = x.d.ld, qld = x.d.qld;
  const uint64_t rows = x.d.rows, cols = x.d.cols;
  const uint32_t k = x.d.k;
  const uint64_t chunks = x.chunks1;
  const uint64_t local = tile - prefix[b];
  const uint64_t rowTile = local / chunks, chunk = local % chunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t i0 = rowTile * (kWarps * RW) + uint64_t(warp) * RW;
  const uint32_t limBits = __float_as_uint(x.d.limit) & 0x7fffffffu;

  // Row r of the warp: its elements at g / e [row[r] + j] for j0 <= j < lim[r] (the row's length,
  // cut at the chunk's end; 0: no row).
  const uint32_t j0 = uint32_t(chunk * ct), j1 = uint32_t(min(cols, chunk * ct + ct));
  uint64_t row[RW];  // buffer offset of the row's element 0
  uint32_t lim[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    const uint64_t i = i0 + r;
    const uint32_t len = i < rows ? uint32_t(rowLength(i, ld, cols, valid)) : 0;
    lim[r] = min(len, j1);
    row[r] = len ? offset + i * ld : 0;
  }
  unsigned bad = 0;
  for (uint32_t c0 = 0; c0 < k; c0 += K) {
    const bool first = c0 == 0;              // E += G and the count happen once, in the first group
    const bool readG = !kFeedback || first;  // later groups read M from E
    const float* q = qt + x.d.qt + uint64_t(c0) * qld;
    float acc[RW][K];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < K; ++c) acc[r][c] = 0.f;

    // Pointers at this lane's column of each row, advanced 32 U columns a step; rem[r]: elements
    // of row r left from there (<= 0: none), qrem: columns of the chunk left.
    const T* gp[RW];
    float* ep[RW];
    int32_t rem[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      gp[r] = g + row[r] + j0 + lane;
      if constexpr (kFeedback) ep[r] = e + row[r] + j0 + lane;
      rem[r] = int32_t(lim[r]) - int32_t(j0 + lane);
    }
    const float* qp = q + j0 + lane;
    for (int32_t qrem = int32_t(j1) - int32_t(j0 + lane); qrem > 0; qrem -= 32 * U) {
      // Every load of M for the step is issued before anything is stored: E is read and written
      // through one pointer, so the compiler would not move a later load above a store. (Qt is
      // read where it is used: it comes from L1.)
      float gv[U][RW], ev[U][RW];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const bool in = 32 * u < rem[r];
          gv[u][r] = readG && in ? toF(gp[r][32 * u]) : 0.f;  // missing elements count as zeros
          if constexpr (kFeedback) ev[u][r] = in ? ep[r][32 * u] : 0.f;
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float v[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          if constexpr (kFeedback)
            v[r] = first ? gv[u][r] + ev[u][r] : ev[u][r];
          else
            v[r] = gv[u][r];
          if (first && 32 * u < rem[r]) {
            if constexpr (kFeedback) ep[r][32 * u] = v[r];
            bad += beyond(v[r], limBits);
          }
        }
        const float* qc = qp + 32 * u;
        const bool qin = 32 * u < qrem;
#pragma unroll
        for (int c = 0; c < K; ++c, qc += qld) {
          const float qv = qin && c0 + c < k ? __ldg(qc) : 0.f;
#pragma unroll
          for (int r = 0; r < RW; ++r) acc[r][c] = fmaf(v[r], qv, acc[r][c]);
        }
      }
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        gp[r] += 32 * U;
        if constexpr (kFeedback) ep[r] += 32 * U;
        rem[r] -= 32 * U;
      }
      qp += 32 * U;
    }

#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const float v = warpTransposeSum<K>(acc[r], lane);
      const uint64_t i = i0 + r;
      const uint32_t c = c0 + lane / kLanesPerSum;
      if (lane % kLanesPerSum == 0 && c < k && i < rows) {
        if (chunks == 1)
          p[x.d.p + i * k + c] = v;
        else
          ws[x.ws1 + (chunk * rows + i) * k + c] = v;
      }
    }
  }
  addBlockCount(bad, nonFinite);
}

// P = the sum of a row's chunk partials, in chunk order. Element idx = i * k + c of the block's P.
__global__ void __launch_bounds__(kReduceThreads)
    reduce1Kernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                  uint32_t nBlocks, const float* __restrict ws, float* __restrict p) {
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock& x = blocks[b];
  const uint64_t size = uint64_t(x.d.rows) * x.d.k;
  const uint64_t idx = (tile - prefix[b]) * kReduceThreads + threadIdx.x;
  if (idx >= size) return;
  const float* src = ws + x.ws1 + idx;
  float s = 0.f;
  for (uint64_t t = 0; t < x.chunks1; ++t) s += src[t * size];
  p[x.d.p + idx] = s;
}

}  // namespace

cudaError_t errorFeedbackAndP(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                              const float* qt, float* p, float* nonFinite, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->total[kTiles1] == 0) return cudaSuccess;
  cudaError_t err = withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return withBucket(t->bucket, [&](auto bucket) {
      constexpr int K = decltype(bucket)::value;
      const auto* gt = static_cast<const T*>(g);
      return e ? launch(pass1Kernel<T, true, K>, t->total[kTiles1], kThreads, stream, t->blocks,
                        t->pre(kTiles1), t->n, t->ct1, gt, e, qt, p, t->ws, nonFinite)
               : launch(pass1Kernel<T, false, K>, t->total[kTiles1], kThreads, stream, t->blocks,
                        t->pre(kTiles1), t->n, t->ct1, gt, e, qt, p, t->ws, nonFinite);
    });
  });
  if (err != cudaSuccess) return err;
  return launch(reduce1Kernel, t->total[kReduce1], kReduceThreads, stream, t->blocks,
                t->pre(kReduce1), t->n, t->ws, p);
}

}  // namespace lowrank::cuda
