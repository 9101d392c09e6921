// The exact (uncompressed) part of a buffer: packed into the float32 payload of allreduce #1 and
// unpacked from it. Host twins: phases::packExact / phases::unpackExact (plugin/engine/phases.cc),
// which call host::toFloat32 + host::countNonFinite and host::fromFloat32.
// A CUDA block takes kElemsPerCta consecutive elements of one run (coalesced both ways).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

// payload = float32(G); counts NaN / Inf (no magnitude limit: the exact part cannot overflow P/Q).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    packKernel(const ExactDesc* __restrict runs, const uint64_t* __restrict prefix, uint32_t nRuns,
               const T* __restrict g, float* __restrict payload, float* nonFinite) {
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nRuns, tile);
  const ExactDesc d = runs[b];
  const uint64_t first = (tile - prefix[b]) * kElemsPerCta;
  unsigned bad = 0;
#pragma unroll
  for (int u = 0; u < kElemsPerCta / kThreads; ++u) {
    const uint64_t i = first + u * kThreads + threadIdx.x;
    if (i < d.numel) {
      const float v = toF(g[d.offset + i]);
      payload[d.exactOffset + i] = v;
      bad += isNonFinite(v);
    }
  }
  addBlockCount(bad, nonFinite);
}

// out = scale * payload, cast to the dtype.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    unpackKernel(const ExactDesc* __restrict runs, const uint64_t* __restrict prefix,
                 uint32_t nRuns, const float* __restrict payload, float scale, T* __restrict out) {
  const uint64_t tile = blockIdx.x;
  const uint32_t b = findBlock(prefix, nRuns, tile);
  const ExactDesc d = runs[b];
  const uint64_t first = (tile - prefix[b]) * kElemsPerCta;
#pragma unroll
  for (int u = 0; u < kElemsPerCta / kThreads; ++u) {
    const uint64_t i = first + u * kThreads + threadIdx.x;
    if (i < d.numel) out[d.offset + i] = fromF<T>(scale * payload[d.exactOffset + i]);
  }
}

}  // namespace

cudaError_t packExact(const ExactTable* t, const void* g, lowrankDataType_t dtype, float* payload,
                      float* nonFinite, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->tiles == 0) return cudaSuccess;
  return withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch(packKernel<T>, t->tiles, kThreads, stream, t->runs, t->prefix, t->n,
                  static_cast<const T*>(g), payload, nonFinite);
  });
}

cudaError_t unpackExact(const ExactTable* t, const float* payload, float scale, void* out,
                        lowrankDataType_t dtype, cudaStream_t stream) {
  if (!t) return cudaErrorInvalidValue;
  if (t->tiles == 0) return cudaSuccess;
  return withDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch(unpackKernel<T>, t->tiles, kThreads, stream, t->runs, t->prefix, t->n, payload,
                  scale, static_cast<T*>(out));
  });
}

}  // namespace lowrank::cuda
