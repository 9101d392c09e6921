// Small element-wise launches: scale (host twin host::scale), setFloat, toWire / fromWire (16-bit
// factors on the wire: host twins util/convert.h's toBf16 / toHalf and toFloat), and scatterQ, the warm
// start's copy of the wire Qbar of each column block into the whole-tensor Qt (host twin: the
// engine's copy loop; nothing is written when the call is not trusted).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

__global__ void __launch_bounds__(kThreads) scaleKernel(float* __restrict x, uint64_t n, float s) {
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) x[i] *= s;
}

__global__ void setFloatKernel(float* x, float v) { *x = v; }

template <typename H>
__global__ void __launch_bounds__(kThreads)
    toWireKernel(const float* __restrict x, uint64_t n, H* __restrict out) {
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    out[i] = fromF<H>(x[i]);
}

template <typename H>
__global__ void __launch_bounds__(kThreads)
    fromWireKernel(const H* __restrict in, uint64_t n, float* __restrict x) {
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    x[i] = toF(in[i]);
}

__global__ void __launch_bounds__(kThreads)
    scatterQKernel(const ScatterTable::Dev* __restrict blocks, const uint64_t* __restrict prefix,
                   uint32_t nBlocks, const float* __restrict wire, float* __restrict qt,
                   const float* __restrict checks, float expectedOp) {
  if (checks && (checks[0] != 0.f || checks[1] != expectedOp)) return;
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nBlocks, tile);
  const ScatterTable::Dev& x = blocks[b];
  const uint64_t cols = x.d.cols, size = cols * x.d.k;
  const uint64_t first = (tile - prefix[b]) * kElemsPerCta;
#pragma unroll
  for (int u = 0; u < kElemsPerCta / kThreads; ++u) {
    const uint64_t idx = first + u * kThreads + threadIdx.x;  // c * cols + j
    if (idx < size) {
      const uint64_t c = idx / cols, j = idx % cols;
      qt[x.dstOffset + c * x.dstLd + j] = wire[x.d.qt + c * x.d.qld + j];
    }
  }
}

}  // namespace

cudaError_t scale(float* x, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const uint64_t blocks = std::min<uint64_t>(ceilDiv(n, kThreads), 65536);
  return launch(scaleKernel, blocks, kThreads, stream, x, uint64_t(n), s);
}

cudaError_t toWire(const float* x, size_t n, void* out, lowrankDataType_t wire,
                   cudaStream_t stream) {
  if (wire != lowrankBfloat16 && wire != lowrankFloat16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const uint64_t blocks = std::min<uint64_t>(ceilDiv(n, kThreads), 65536);
  if (wire == lowrankBfloat16)
    return launch(toWireKernel<__nv_bfloat16>, blocks, kThreads, stream, x, uint64_t(n),
                  static_cast<__nv_bfloat16*>(out));
  return launch(toWireKernel<__half>, blocks, kThreads, stream, x, uint64_t(n),
                static_cast<__half*>(out));
}

cudaError_t fromWire(const void* in, size_t n, float* x, lowrankDataType_t wire,
                     cudaStream_t stream) {
  if (wire != lowrankBfloat16 && wire != lowrankFloat16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const uint64_t blocks = std::min<uint64_t>(ceilDiv(n, kThreads), 65536);
  if (wire == lowrankBfloat16)
    return launch(fromWireKernel<__nv_bfloat16>, blocks, kThreads, stream,
                  static_cast<const __nv_bfloat16*>(in), uint64_t(n), x);
  return launch(fromWireKernel<__half>, blocks, kThreads, stream, static_cast<const __half*>(in),
                uint64_t(n), x);
}

cudaError_t setFloat(float* x, float v, cudaStream_t stream) {
  return launch(setFloatKernel, 1, 1, stream, x, v);
}

cudaError_t scatterQ(const ScatterTable* t, const float* wire, float* qt, const float* checks,
                     float expectedOp, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->tiles == 0) return cudaSuccess;
  return launch(scatterQKernel, t->tiles, kThreads, stream, t->blocks, t->prefix, t->n, wire, qt,
                checks, expectedOp);
}

}  // namespace lowrank::cuda
