// Test support for the device tests: skipping without a GPU, one-rank NCCL communicators, and
// host <-> device copies of float vectors in any compressible dtype. Built against CUDA and NCCL,
// or against the CPU emulation of CUDA (tests/gpu/emu) and the NCCL test double.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "kernels/host/powersgd_kernels.h"
#include "lowrank/lowrank.h"
#include "lowrank/lowrank_nccl.h"

namespace lowrank::testing {

// "" when a device is usable, else why not (the tests skip with that message).
inline std::string noDevice() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
}

// Where the tests run: the GPU's name, or the emulation's ("CPU emulation (tests/gpu/emu)").
inline std::string deviceName() {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "no device";
  return p.name;
}

#define LR_SKIP_WITHOUT_DEVICE()                                  \
  do {                                                            \
    const std::string why = ::lowrank::testing::noDevice();       \
    if (!why.empty()) GTEST_SKIP() << why;                        \
  } while (0)

inline size_t dtypeBytes(lowrankDataType_t t) { return t == lowrankFloat32 ? 4 : 2; }

// A device copy of x in dtype t (rounded as the host converters round), landed when this returns.
inline void* toDevice(const std::vector<float>& x, lowrankDataType_t t) {
  std::vector<char> raw(x.size() * dtypeBytes(t));
  host::fromFloat32(x.data(), x.size(), 1.f, raw.data(), t);
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, raw.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, raw.data(), raw.size(), cudaMemcpyHostToDevice), cudaSuccess);
  // Landed before any stream reads it: a synchronous copy from pageable memory may return before
  // its data does (CUDA's "API synchronization behavior"), and non-blocking streams are not
  // ordered with the legacy default stream that carries it.
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  return d;
}

inline std::vector<float> fromDevice(const void* d, size_t count, lowrankDataType_t t) {
  std::vector<char> raw(count * dtypeBytes(t));
  EXPECT_EQ(cudaMemcpy(raw.data(), d, raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> x(count);
  host::toFloat32(raw.data(), t, count, x.data());
  return x;
}

// ||a - b|| / ||b||
inline double relErr(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += double(a[i] - b[i]) * double(a[i] - b[i]);
    n += double(b[i]) * double(b[i]);
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// The device engine, not the host engine, ran recv's calls: a device plan has chunks even when not
// pipelined (a host plan then has none), the comm's counters count `compressedCalls` and device
// state is held. (One comm rank: nothing goes on any wire, host or device.)
inline void expectDeviceEngineRan(lowrankComm_t comm, const void* recv, uint64_t compressedCalls) {
  lowrankBufferView_t view;
  ASSERT_EQ(lowrankBufferGetView(comm, recv, &view), lowrankSuccess);
  EXPECT_EQ(view.planned, 1);
  EXPECT_GE(view.chunks, 1u) << "not a device plan";
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
  EXPECT_EQ(st.compressedCalls, compressedCalls);
  EXPECT_GT(st.stateBytes, 0u);
  EXPECT_EQ(st.elementsSent, 0u) << "one comm rank sent elements";
}

// The elements of the tensors of `shapes`.
inline size_t countOf(const std::vector<std::vector<size_t>>& shapes) {
  size_t count = 0;
  for (const auto& s : shapes) {
    size_t n = 1;
    for (size_t d : s) n *= d;
    count += n;
  }
  return count;
}

// lowrankBufferSetLayout of buf: the tensors of `shapes`, in order.
inline void setLayoutOf(lowrankComm_t comm, const void* buf,
                        const std::vector<std::vector<size_t>>& shapes) {
  std::vector<int> ndims;
  std::vector<const size_t*> dims;
  for (const auto& s : shapes) {
    ndims.push_back(int(s.size()));
    dims.push_back(s.data());
  }
  ASSERT_EQ(lowrankBufferSetLayout(comm, buf, int(shapes.size()), ndims.data(), dims.data()),
            lowrankSuccess);
}

// A one-rank NCCL communicator on device 0 and a lowrank communicator over it.
struct OneRankNccl {
  ncclComm_t nccl = nullptr;
  lowrankComm_t comm = nullptr;
  explicit OneRankNccl(lowrankConfig_t cfg) {
    int dev = 0;
    EXPECT_EQ(ncclCommInitAll(&nccl, 1, &dev), ncclSuccess);
    EXPECT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess)
        << lowrankGetLastError(nullptr);
  }
  ~OneRankNccl() {
    if (comm) lowrankCommDestroy(comm);
    if (nccl) ncclCommDestroy(nccl);
  }
};

}  // namespace lowrank::testing
