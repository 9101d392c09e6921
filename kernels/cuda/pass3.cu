// Pass 3: fused decompress and error update over every column block of a table, A = P Qbar^T:
// out = scale * A (cast to the dtype), E = M - A (E holds M). Host twin:
// host::decompressAndUpdateError (kernels/host/powersgd_kernels.cc). The `checks` path (a call not
// to be trusted: out = NaN, E = 0) is the engine's, done here to save a pass.
//
// A CUDA block takes a tile of kCols3 columns (one per thread, its K values of Qbar in registers)
// x kRows3 rows (their P rows in shared memory, read as broadcasts): every element of E and out is
// read / written once, coalesced. k > 32 takes a plain loop over k from global memory (slow path).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

template <int K>
__device__ __forceinline__ float dotRow(const float* row, const float (&qb)[K]) {
  float a = 0.f;
  if constexpr (K % 4 == 0) {
#pragma unroll
    for (int c = 0; c < K; c += 4) {
      const float4 f = *reinterpret_cast<const float4*>(row + c);
      a = fmaf(f.x, qb[c], a);
      a = fmaf(f.y, qb[c + 1], a);
      a = fmaf(f.z, qb[c + 2], a);
      a = fmaf(f.w, qb[c + 3], a);
    }
  } else {
#pragma unroll
    for (int c = 0; c < K; ++c) a = fmaf(row[c], qb[c], a);
  }
  return a;
}

// True when the call must not be trusted (a rank saw a non-finite input, or the ops differ).
__device__ __forceinline__ bool poisoned(const float* checks, float expectedOp) {
  return checks && (checks[0] != 0.f || checks[1] != expectedOp);
}

// The tile of a CUDA block: column j of this thread, rows [i0, i0 + nr).
struct Tile3 {
  const DevBlock* x;
  uint64_t i0;
  int nr;
  uint32_t j;
};
__device__ __forceinline__ Tile3 tile3(const DevBlock* blocks, const uint64_t* prefix,
                                       uint32_t nBlocks) {
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const DevBlock* x = blocks + b;
  const uint64_t local = tile - prefix[b];
  const uint64_t colTile = local % x->colTiles3, rowTile = local / x->colTiles3;
  const uint64_t i0 = rowTile * kRows3;
  return {x, i0, int(min(uint64_t(kRows3), x->d.rows - i0)),
          uint32_t(colTile * kCols3 + threadIdx.x)};
}

// What a launch writes (A = P Qbar^T): kUpdate3, out = scale A and E = M - A (PowerSGD's pass 3);
// kOut3, out alone (no error feedback); kSubtract3, E -= A alone (the alternating Q step's
// residual: no out, no checks); kDrop3, out alone, and E = 0 on an untrusted call (the
// alternating decompression: its residual was taken before the allreduce).
enum Pass3Mode { kUpdate3, kOut3, kSubtract3, kDrop3 };
__host__ __device__ constexpr bool readsE(int mode) { return mode == kUpdate3 || mode == kSubtract3; }
__host__ __device__ constexpr bool zeroesE(int mode) { return mode == kUpdate3 || mode == kDrop3; }

// out = NaN, E = 0 over the tile's elements.
template <typename TO, bool kFeedback>
__device__ void poisonTile(const Tile3& t, float* __restrict e, TO* __restrict out) {
  const BlockDesc& d = t.x->d;
  const TO nan = fromF<TO>(__int_as_float(0x7fffffff));
  for (int r = 0; r < t.nr; ++r) {
    const uint64_t i = t.i0 + r;
    if (t.j < rowLength(i, d.ld, d.cols, d.valid)) {
      const uint64_t o = d.offset + i * d.ld + t.j;
      out[o] = nan;
      if (kFeedback) e[o] = 0.f;
    }
  }
}

template <typename TO, int kMode, int K>
__global__ void __launch_bounds__(kThreads)
    pass3Kernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                uint32_t nBlocks, float* __restrict e, const float* __restrict p,
                const float* __restrict qbart, float scale, TO* __restrict out,
                const float* __restrict checks, float expectedOp) {
  constexpr bool kFeedback = readsE(kMode), kOut = kMode != kSubtract3;
  __shared__ __align__(16) float sP[kRows3][K];
  const Tile3 t = tile3(blocks, prefix, nBlocks);
  const BlockDesc& d = t.x->d;
  if (poisoned(checks, expectedOp)) {  // the same for every thread: no barrier is skipped
    poisonTile<TO, zeroesE(kMode)>(t, e, out);
    return;
  }
  const uint32_t k = d.k;
  float qb[K];
#pragma unroll
  for (int c = 0; c < K; ++c)
    qb[c] = t.j < d.cols && c < int(k) ? qbart[d.qt + c * d.qld + t.j] : 0.f;
  for (int idx = threadIdx.x; idx < kRows3 * K; idx += kThreads) {
    const int r = idx / K, c = idx % K;
    sP[r][c] = r < t.nr && c < int(k) ? p[d.p + (t.i0 + r) * k + c] : 0.f;
  }
  __syncthreads();
  // kStep3 rows at a time: their E loads first (branch-free), then the arithmetic and the stores
  // (a load of E after a store to E would wait for it: the same pointer). Element (i, j) of the
  // block exists iff j < cols and i ld + j < valid; pos walks i ld + j down the tile.
  const uint64_t ld = d.ld, valid = d.valid, offset = d.offset;
  const bool colIn = t.j < d.cols;
  uint64_t pos = t.i0 * ld + t.j;
  for (int r0 = 0; r0 < t.nr; r0 += kStep3, pos += kStep3 * ld) {
    bool in[kStep3];
    float m[kStep3];
#pragma unroll
    for (int s = 0; s < kStep3; ++s) {
      in[s] = colIn && r0 + s < t.nr && pos + s * ld < valid;
      m[s] = kFeedback && in[s] ? e[offset + pos + s * ld] : 0.f;
    }
#pragma unroll
    for (int s = 0; s < kStep3; ++s) {
      if (in[s]) {
        const uint64_t o = offset + pos + s * ld;
        const float a = dotRow<K>(sP[r0 + s], qb);
        if (kOut) out[o] = fromF<TO>(scale * a);
        if (kFeedback) e[o] = m[s] - a;
      }
    }
  }
}

// k > 32: the same tiles, A summed over k straight from global memory.
template <typename TO, int kMode>
__global__ void __launch_bounds__(kThreads)
    pass3GenericKernel(const DevBlock* __restrict blocks, const uint64_t* __restrict prefix,
                       uint32_t nBlocks, float* __restrict e, const float* __restrict p,
                       const float* __restrict qbart, float scale, TO* __restrict out,
                       const float* __restrict checks, float expectedOp) {
  constexpr bool kFeedback = readsE(kMode), kOut = kMode != kSubtract3;
  const Tile3 t = tile3(blocks, prefix, nBlocks);
  const BlockDesc& d = t.x->d;
  if (poisoned(checks, expectedOp)) {
    poisonTile<TO, zeroesE(kMode)>(t, e, out);
    return;
  }
  for (int r = 0; r < t.nr; ++r) {
    const uint64_t i = t.i0 + r;
    if (t.j < rowLength(i, d.ld, d.cols, d.valid)) {
      const float* pr = p + d.p + i * d.k;
      float a = 0.f;
      for (uint32_t c = 0; c < d.k; ++c) a = fmaf(pr[c], qbart[d.qt + c * d.qld + t.j], a);
      const uint64_t o = d.offset + i * d.ld + t.j;
      if (kOut) out[o] = fromF<TO>(scale * a);
      if (kFeedback) e[o] = e[o] - a;
    }
  }
}

template <typename TO, int kMode>
cudaError_t launch3(const BlockTable* t, float* e, const float* p, const float* qbart, float scale,
                    TO* out, const float* checks, float expectedOp, cudaStream_t stream) {
  if (t->kmax > kBucketMax)
    return launch(pass3GenericKernel<TO, kMode>, t->total[kTiles3], kThreads, stream, t->blocks,
                  t->pre(kTiles3), t->n, e, p, qbart, scale, out, checks, expectedOp);
  return withBucket(t->bucket, [&](auto bucket) {
    constexpr int K = decltype(bucket)::value;
    return launch(pass3Kernel<TO, kMode, K>, t->total[kTiles3], kThreads, stream, t->blocks,
                  t->pre(kTiles3), t->n, e, p, qbart, scale, out, checks, expectedOp);
  });
}

}  // namespace

namespace detail {

cudaError_t subtractLowRank(const BlockTable* t, float* e, const float* p, const float* qt,
                            cudaStream_t stream) {
  if (!t || !e) return cudaErrorInvalidValue;
  if (t->total[kTiles3] == 0) return cudaSuccess;
  float* none = nullptr;
  return launch3<float, kSubtract3>(t, e, p, qt, 0.f, none, nullptr, 0.f, stream);
}

}  // namespace detail

cudaError_t decompressAlternate(const BlockTable* t, float* e, const float* p, const float* qbart,
                                float scale, void* out, lowrankDataType_t dtype,
                                const float* checks, float expectedOp, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->total[kTiles3] == 0) return cudaSuccess;
  return withDtype(dtype, [&](auto tag) {
    using TO = decltype(tag);
    TO* o = static_cast<TO*>(out);
    return e ? launch3<TO, kDrop3>(t, e, p, qbart, scale, o, checks, expectedOp, stream)
             : launch3<TO, kOut3>(t, e, p, qbart, scale, o, checks, expectedOp, stream);
  });
}

cudaError_t decompressAndUpdateError(const BlockTable* t, float* e, const float* p,
                                     const float* qbart, float scale, void* out,
                                     lowrankDataType_t dtype, const float* checks, float expectedOp,
                                     cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->total[kTiles3] == 0) return cudaSuccess;
  return withDtype(dtype, [&](auto tag) {
    using TO = decltype(tag);
    TO* o = static_cast<TO*>(out);
    return e ? launch3<TO, kUpdate3>(t, e, p, qbart, scale, o, checks, expectedOp, stream)
             : launch3<TO, kOut3>(t, e, p, qbart, scale, o, checks, expectedOp, stream);
  });
}

}  // namespace lowrank::cuda
