// A CPU emulation of the CUDA subset that kernels/cuda uses, so that the kernels and their tests
// (tests/gpu/test_cuda_kernels.cc) run on machines without a GPU: every CUDA thread is a fiber,
// the CUDA blocks of a launch run one after another, __syncthreads and warp shuffles are barriers
// between the fibers. Strict where CUDA is undefined: a barrier that some thread of the block (or
// lane of the warp) never reaches aborts with a message instead of hanging. A launch is queued on
// its stream and runs when the emulated runtime gets to it (runtime.h); device memory is host
// memory filled with NaN bytes (0xff), so reading what was never written shows. Single-threaded;
// x86-64 only (a tiny context switch in emu.cc). Not for speed: small shapes only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "cuda_runtime_api.h"
#include "host_work.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct EmuIdx {
  unsigned x = 0, y = 0, z = 0;
};

struct alignas(16) float4 {
  float x, y, z, w;
};

namespace emu {

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;
  int wait = 0;  // kNone, kBlock or kWarp
  uint64_t gen = 0;
  bool done = false;
};

struct State {
  EmuIdx tIdx, bIdx, bDim, gDim;  // threadIdx, blockIdx, blockDim, gridDim
  std::vector<Fiber> fibers;
  unsigned cur = 0;
  void* schedSp = nullptr;
  unsigned blockArrived = 0;
  uint64_t blockGen = 0;
  std::vector<unsigned> warpArrived;
  std::vector<uint64_t> warpGen;
  std::vector<uint64_t> slots;  // one per thread: shuffle / warp-reduce exchange
  const std::function<void()>* body = nullptr;
  ~State() {
    for (Fiber& f : fibers) std::free(f.stack);
  }
};

inline State& state() {
  static State s;
  return s;
}

void syncBlock();
void syncWarp();
// Runs body on grid x block fibers now (emu.cc).
cudaError_t launch(unsigned grid, unsigned block, const std::function<void()>& body);

// Queues that run on stream s; body holds copies of the kernel's arguments, as a CUDA launch
// copies its parameters when it is issued. The fibers are those of the library that queued it.
template <typename F>
cudaError_t launchOn(cudaStream_t s, unsigned grid, unsigned block, F body) {
  if (block == 0 || block > 1024 || grid == 0 || grid > 0x7fffffffu)
    return cudaErrorInvalidConfiguration;
  if (int e = checkKernelLaunch(s, &body, sizeof body)) return cudaError_t(e);
  return cudaError_t(enqueueHostWork(s, "kernel launch", [grid, block, body] { launch(grid, block, body); }));
}

template <typename T>
T exchange(T v, unsigned (*src)(unsigned lane, unsigned arg), unsigned arg) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  State& s = state();
  const unsigned t = s.tIdx.x;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  s.slots[t] = bits;
  syncWarp();
  const uint64_t r = s.slots[(t & ~31u) | src(t & 31u, arg)];
  syncWarp();  // every lane has read before the slots are reused
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

}  // namespace emu

#define threadIdx (::emu::state().tIdx)
#define blockIdx (::emu::state().bIdx)
#define blockDim (::emu::state().bDim)
#define gridDim (::emu::state().gDim)

inline void __syncthreads() { emu::syncBlock(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int laneMask) {
  return emu::exchange<T>(
      v, [](unsigned lane, unsigned m) { return (lane ^ m) & 31u; }, unsigned(laneMask));
}

template <typename T>
T __shfl_sync(unsigned, T v, int srcLane) {
  return emu::exchange<T>(
      v, [](unsigned, unsigned src) { return src & 31u; }, unsigned(srcLane));
}

// Every lane of the warp must reach it (strict, as __syncthreads); memory written before it is
// seen by the warp's lanes after it (the fibers share the host's memory).
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncWarp(); }

inline unsigned __reduce_add_sync(unsigned, unsigned v) {
  emu::State& s = emu::state();
  const unsigned t = s.tIdx.x, w0 = t & ~31u;
  s.slots[t] = v;
  emu::syncWarp();
  unsigned sum = 0;
  for (unsigned l = w0; l < w0 + 32 && l < s.bDim.x; ++l) sum += unsigned(s.slots[l]);
  emu::syncWarp();
  return sum;
}

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) { return __uint_as_float(unsigned(i)); }

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}

template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
