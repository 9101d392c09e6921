// Pass 2: Q = M^T P over every column block of a table, written as Qt (k x cols, row stride qld).
// Host twin: host::computeQ (kernels/host/powersgd_kernels.cc).
//
// A CUDA block takes a tile of kCols2 columns x sr2 rows (a slab) of one block: each lane owns two
// columns (coalesced reads of M along a row), the rows are dealt to the warps, and the slab's P
// rows are staged in shared memory chunkRows2(K) rows at a time (every lane reads the same P row:
// a broadcast; double-buffered, one barrier per chunk). Each thread keeps 2 x K accumulators; the
// warps' sums are added in shared memory in warp order. A block cut into several slabs leaves one
// partial Qt per slab in the workspace, summed in slab order by reduce2: deterministic, no float
// atomics. k > 32 loops over groups of 32 columns of P, re-reading M: the slow path.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

// Row r of a K-wide shared array into registers, 16 bytes at a time where K allows.
template <int K>
__device__ __forceinline__ void loadRow(const float* row, float (&v)[K]) {
  if constexpr (K % 4 == 0) {
#pragma unroll
    for (int c = 0; c < K; c += 4) {
      const float4 f = *reinterpret_cast<const float4*>(row + c);
      v[c] = f.x, v[c + 1] = f.y, v[c + 2] = f.z, v[c + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < K; ++c) v[c] = row[c];
  }
}

// What M is: kPlain2, m itself (E, or G without error feedback: PowerSGD's pass 2); the
// alternating Q step's (alternate.cu): kAdd2, M = G + E with m = G, written into E and counted
// (elements beyond the block's limit, into *nonFinite); kCount2, M = G = m, counted.
enum Pass2Mode { kPlain2, kAdd2, kCount2 };

// TM: the element type of m (float when M is E, else the gradient's dtype).
template <typename TM, int K, int kMode = kPlain2>
__global__ void __launch_bounds__(kThreads, minBlocks2(K))
    pass2Kernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                uint32_t nBlocks, uint64_t sr, const TM* __restrict m, const float* __restrict p,
                float* __restrict qt, float* __restrict ws, float* e, float* nonFinite) {
  constexpr int kGroup = K < 8 ? K : 8;  // Qt rows per round of the cross-warp sum
  constexpr int kChunk = chunkRows2(K);
  __shared__ __align__(16) float sP[2][kChunk][K];
  __shared__ float sSum[kWarps][kGroup][kCols2];

  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock& x = blocks[b];
  const uint64_t offset = x.d.offset, valid = x.d.valid, ld = x.d.ld, qld = x.d.qld;
  const uint64_t rows = x.d.rows, cols = x.d.cols;
  const uint32_t k = x.d.k;
  const uint64_t local = tile - prefix[b];
  const uint64_t colTile = local % x.colTiles2, slab = local / x.colTiles2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t j0 = uint32_t(colTile * kCols2), jA = j0 + lane, jB = jA + 32;
  const uint64_t rBegin = slab * sr, rEnd = min(rows, rBegin + sr);
  const uint32_t limBits = __float_as_uint(x.d.limit) & 0x7fffffffu;
  unsigned bad = 0;

  for (uint32_t c0 = 0; c0 < k; c0 += K) {
    const bool first = c0 == 0;  // kAdd2: E += G and the count once, in the first group
    float acc[2][K];
#pragma unroll
    for (int c = 0; c < K; ++c) acc[0][c] = acc[1][c] = 0.f;

    // P goes through two shared buffers, one barrier per chunk: buffer b is rewritten two chunks
    // after it was read, past the barrier of the chunk between. K <= 16 loads it one chunk ahead
    // into registers (those loads go out with the chunk's loads of M); K = 32 has no registers to
    // spare (it would spill) and loads it in place.
    constexpr bool kAhead = K <= 16;
    constexpr int kPPer = kAhead ? (kChunk * K + kThreads - 1) / kThreads : 1;
    auto loadP = [&](uint64_t ch, int idx) {
      const int nr = int(min(uint64_t(kChunk), rEnd - ch));
      const int r = idx / K, c = idx % K;
      return r < nr && c0 + c < k ? p[x.d.p + (ch + r) * k + c0 + c] : 0.f;
    };
    float pre[kPPer];
    auto fetchP = [&](uint64_t ch) {
#pragma unroll
      for (int u = 0; u < kPPer; ++u) {
        const int idx = threadIdx.x + u * kThreads;
        pre[u] = idx < kChunk * K ? loadP(ch, idx) : 0.f;
      }
    };
    if (kAhead && rBegin < rEnd) fetchP(rBegin);
    int buf = 0;
    for (uint64_t ch = rBegin; ch < rEnd; ch += kChunk, buf ^= 1) {
      const int nr = int(min(uint64_t(kChunk), rEnd - ch));
      if constexpr (kAhead) {
#pragma unroll
        for (int u = 0; u < kPPer; ++u) {
          const int idx = threadIdx.x + u * kThreads;
          if (idx < kChunk * K) sP[buf][idx / K][idx % K] = pre[u];
        }
      } else {
        for (int idx = threadIdx.x; idx < kChunk * K; idx += kThreads)
          sP[buf][idx / K][idx % K] = loadP(ch, idx);
      }
      __syncthreads();
      if (kAhead && ch + kChunk < rEnd) fetchP(ch + kChunk);
      // Every load of the chunk first (branch-free, so the compiler issues them together), then
      // the arithmetic. Rows past the chunk's end have P = 0 in sP and M = 0 here.
      constexpr int kRowsPerWarp = kChunk / kWarps;
      float ma[kRowsPerWarp], mb[kRowsPerWarp];
      bool inA[kRowsPerWarp], inB[kRowsPerWarp];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp + rr * kWarps;
        const uint64_t i = ch + r;
        const uint64_t len = r < nr ? rowLength(i, ld, cols, valid) : 0;
        const uint64_t at = offset + i * ld;
        inA[rr] = jA < len;
        inB[rr] = jB < len;
        if constexpr (kMode == kAdd2) {
          ma[rr] = inA[rr] ? (first ? toF(m[at + jA]) + e[at + jA] : e[at + jA]) : 0.f;
          mb[rr] = inB[rr] ? (first ? toF(m[at + jB]) + e[at + jB] : e[at + jB]) : 0.f;
        } else {
          ma[rr] = inA[rr] ? toF(m[at + jA]) : 0.f;  // missing elements count as zeros
          mb[rr] = inB[rr] ? toF(m[at + jB]) : 0.f;
        }
      }
      if (kMode != kPlain2 && first) {
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          const uint64_t at = offset + (ch + warp + rr * kWarps) * ld;
          if (inA[rr]) {
            if constexpr (kMode == kAdd2) e[at + jA] = ma[rr];
            bad += beyond(ma[rr], limBits);
          }
          if (inB[rr]) {
            if constexpr (kMode == kAdd2) e[at + jB] = mb[rr];
            bad += beyond(mb[rr], limBits);
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        float pr[K];
        loadRow<K>(sP[buf][warp + rr * kWarps], pr);
#pragma unroll
        for (int c = 0; c < K; ++c) {
          acc[0][c] = fmaf(pr[c], ma[rr], acc[0][c]);
          acc[1][c] = fmaf(pr[c], mb[rr], acc[1][c]);
        }
      }
    }

    // The warps' partial sums, added in warp order.
#pragma unroll
    for (int cg = 0; cg < K; cg += kGroup) {
      __syncthreads();  // sSum free
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        sSum[warp][g][lane] = acc[0][cg + g];
        sSum[warp][g][lane + 32] = acc[1][cg + g];
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < kGroup * kCols2; idx += kThreads) {
        const int g = idx / kCols2, col = idx % kCols2;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += sSum[w][g][col];
        const uint32_t c = c0 + cg + g;
        const uint64_t j = j0 + col;
        if (c < k && j < cols) {
          if (x.slabs2 == 1)
            qt[x.d.qt + c * qld + j] = s;
          else
            ws[x.ws2 + (slab * k + c) * cols + j] = s;
        }
      }
    }
  }
  if constexpr (kMode != kPlain2) addBlockCount(bad, nonFinite);
}

// Qt = the sum of the slabs' partial Qt, in slab order. Element idx = c * cols + j.
__global__ void __launch_bounds__(kReduceThreads)
    reduce2Kernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                  uint32_t nBlocks, const float* __restrict ws, float* __restrict qt) {
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock& x = blocks[b];
  const uint64_t cols = x.d.cols, size = cols * x.d.k;
  const uint64_t idx = (tile - prefix[b]) * kReduceThreads + threadIdx.x;
  if (idx >= size) return;
  const float* src = ws + x.ws2 + idx;
  float s = 0.f;
  for (uint64_t t = 0; t < x.slabs2; ++t) s += src[t * size];
  qt[x.d.qt + (idx / cols) * x.d.qld + idx % cols] = s;
}

}  // namespace

namespace detail {

cudaError_t computeQCounting(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                             const float* p, float* qt, float* nonFinite, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->total[kTiles2] == 0) return cudaSuccess;
  cudaError_t err = withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return withBucket(t->bucket, [&](auto bucket) {
      constexpr int K = decltype(bucket)::value;
      const T* gt = static_cast<const T*>(g);
      return e ? launch(pass2Kernel<T, K, kAdd2>, t->total[kTiles2], kThreads, stream, t->blocks,
                        t->pre(kTiles2), t->n, t->sr2, gt, p, qt, t->ws, e, nonFinite)
               : launch(pass2Kernel<T, K, kCount2>, t->total[kTiles2], kThreads, stream,
                        t->blocks, t->pre(kTiles2), t->n, t->sr2, gt, p, qt, t->ws, e, nonFinite);
    });
  });
  if (err != cudaSuccess) return err;
  return launch(reduce2Kernel, t->total[kReduce2], kReduceThreads, stream, t->blocks,
                t->pre(kReduce2), t->n, t->ws, qt);
}

}  // namespace detail

cudaError_t computeQ(const BlockTable* t, const void* g, lowrankDataType_t dtype, const float* e,
                     const float* p, float* qt, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->total[kTiles2] == 0) return cudaSuccess;
  cudaError_t err = withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return withBucket(t->bucket, [&](auto bucket) {
      constexpr int K = decltype(bucket)::value;
      float* none = nullptr;
      return e ? launch(pass2Kernel<float, K>, t->total[kTiles2], kThreads, stream, t->blocks,
                        t->pre(kTiles2), t->n, t->sr2, e, p, qt, t->ws, none, none)
               : launch(pass2Kernel<T, K>, t->total[kTiles2], kThreads, stream, t->blocks,
                        t->pre(kTiles2), t->n, t->sr2, static_cast<const T*>(g), p, qt, t->ws,
                        none, none);
    });
  });
  if (err != cudaSuccess) return err;
  return launch(reduce2Kernel, t->total[kReduce2], kReduceThreads, stream, t->blocks,
                t->pre(kReduce2), t->n, t->ws, qt);
}

}  // namespace lowrank::cuda
