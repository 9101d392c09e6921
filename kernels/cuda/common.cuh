// Device helpers shared by the kernels: dtype conversions (the device side of
// util/convert.h), the block lookup of batched launches, warp and block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "lowrank/lowrank.h"

namespace lowrank::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// float32 view of a gradient element; round-to-nearest-even on the way back, as the host's toHalf /
// toBf16 (a NaN stays a NaN, payload aside).
__device__ __forceinline__ float toF(float x) { return x; }
__device__ __forceinline__ float toF(__half x) { return __half2float(x); }
__device__ __forceinline__ float toF(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T fromF(float f);
template <>
__device__ __forceinline__ float fromF<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ __half fromF<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromF<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

// A factor as a 16-bit wire carries it (wire lowrankBfloat16 or lowrankFloat16, round to nearest
// even; any other: unchanged): the host's roundToWire (kernels/host/powersgd_kernels.cc).
__device__ __forceinline__ float roundToWire(float x, int wire) {
  if (wire == lowrankBfloat16) return toF(fromF<__nv_bfloat16>(x));
  if (wire == lowrankFloat16) return toF(fromF<__half>(x));
  return x;
}

// NaN or Inf (exponent all ones), as host nonFinite.
__device__ __forceinline__ bool isNonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}
// |x| >= limit, NaN and Inf included: on the magnitude bits, order is that of |x| and NaN / Inf sit
// above every finite value (host `beyond`).
__device__ __forceinline__ bool beyond(float x, uint32_t limBits) {
  return (__float_as_uint(x) & 0x7fffffffu) >= limBits;
}

// The block of a batched launch that owns CUDA-block-level tile `tile`: the largest b with
// prefix[b] <= tile (blocks without tiles repeat a prefix value and are skipped). prefix has n + 1
// entries and tile < prefix[n].
__device__ __forceinline__ uint32_t findBlock(const uint64_t* __restrict prefix, uint32_t n,
                                              uint64_t tile) {
  uint32_t lo = 0, hi = n;  // invariant: prefix[lo] <= tile < prefix[hi]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (__ldg(prefix + mid) <= tile)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Elements of row i that exist in a block (cols, fewer for the last valid row, 0 beyond):
// host MatrixView::rowLength.
__device__ __forceinline__ uint64_t rowLength(uint64_t i, uint64_t ld, uint64_t cols,
                                              uint64_t valid) {
  const uint64_t start = i * ld;
  if (start >= valid) return 0;
  return valid - start < cols ? valid - start : cols;
}

// One halving step of warpTransposeSum: lanes l and l ^ O swap halves of their W values, each
// keeping (and adding the partner's copy of) the half that bit O of its lane selects.
template <int W, int O>
__device__ __forceinline__ void warpHalve(float* a, int lane) {
  if constexpr (W > 1) {
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < W / 2; ++i) {
      const float send = up ? a[i] : a[i + W / 2];
      const float keep = up ? a[i + W / 2] : a[i];
      a[i] = keep + __shfl_xor_sync(kFullMask, send, O);
    }
    warpHalve<W / 2, O / 2>(a, lane);
  }
}

// Sum of W values per lane over a warp, "transposed": afterwards lane l holds the full sum of value
// l / (32 / W) (every lane of a group of 32 / W lanes holds the same). W - 1 + log2(32 / W)
// shuffles instead of 5 W. Fixed order: deterministic. W is a power of two <= 32.
template <int W>
__device__ __forceinline__ float warpTransposeSum(float* a, int lane) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "W: a power of two <= 32");
  warpHalve<W, 16>(a, lane);
  float v = a[0];
#pragma unroll
  for (int o = 16 / W; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Adds a CUDA block's count of non-finite elements to *dst (one float atomic per CUDA block; counts
// are integers, exact in float below 2^24, and the engine only tests != 0). All threads must call.
__device__ __forceinline__ void addBlockCount(unsigned count, float* dst) {
  __shared__ unsigned total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  count = __reduce_add_sync(kFullMask, count);
  if ((threadIdx.x & 31) == 0 && count) atomicAdd(&total, count);
  __syncthreads();
  if (threadIdx.x == 0 && total && dst) atomicAdd(dst, float(total));
}

// Calls f(T{}) with T the element type of dtype; cudaErrorInvalidValue for other dtypes.
template <typename F>
cudaError_t withDtype(lowrankDataType_t dtype, F&& f) {
  switch (dtype) {
    case lowrankFloat32:
      return f(float{});
    case lowrankFloat16:
      return f(__half{});
    case lowrankBfloat16:
      return f(__nv_bfloat16{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Calls f(std::integral_constant<int, K>{}) for the k bucket K (1, 2, 4, 8, 16 or 32).
template <typename F>
cudaError_t withBucket(int bucket, F&& f) {
  switch (bucket) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Launches kernel k on `grid` CUDA blocks of `block` threads on stream s; returns the launch error.
// Every launch goes through here. LOWRANK_CUDA_EMULATION (tests/gpu/emu) queues the kernel on the
// stream of a CPU emulation instead, so that kernels and tests can be checked without a GPU.
template <typename... P, typename... A>
cudaError_t launch(void (*k)(P...), uint64_t grid, unsigned block, cudaStream_t s, A&&... args) {
  if (grid == 0) return cudaSuccess;
#ifdef LOWRANK_CUDA_EMULATION
  return ::emu::launchOn(s, unsigned(grid), block, [k, args...] { k(args...); });
#else
  k<<<unsigned(grid), block, 0, s>>>(std::forward<A>(args)...);
  return cudaGetLastError();
#endif
}

// Largest grid the kernels take in x (they index tiles by blockIdx.x).
constexpr uint64_t kMaxGrid = 0x7fffffffull;

__host__ __device__ constexpr uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace lowrank::cuda::detail
