// Two communicators on two devices in one process (issue 41, item 3): a lowrank communicator's
// device work goes to its NCCL communicator's device (ncclCommCuDevice) from the first call on
// (its stream, plan check and buffer state are made there), whatever device the calling thread has
// current, and the caller's device is given back after every call. On the CPU emulation of CUDA
// (two devices, tests/gpu/emu) a kernel, an event record or a collective on a stream of another
// device, or a kernel given memory of the other device, is an error, as on a GPU without peer
// access. Needs two devices: skips with fewer (run_device_checks.sh leaves *TwoDevices* out on a
// one-GPU machine). The mutant device_from_current_thread (tests/gpu/emu/mutants.py) fails it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

constexpr size_t kRows = 96, kCols = 128, kCount = kRows * kCols;
constexpr int kCalls = 3;

// One comm rank whose NCCL communicator, stream, inputs and output are on device `dev`.
struct OnDevice {
  int dev;
  ncclComm_t nccl = nullptr;
  lowrankComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* out = nullptr;
  std::vector<void*> inputs;  // one per call

  OnDevice(int d, const std::vector<std::vector<float>>& x) : dev(d) {
    EXPECT_EQ(cudaSetDevice(dev), cudaSuccess);
    EXPECT_EQ(ncclCommInitAll(&nccl, 1, &dev), ncclSuccess);
    lowrankConfig_t cfg = config(4);
    EXPECT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out, kCount * sizeof(float)), cudaSuccess);
    for (const auto& xi : x) inputs.push_back(toDevice(xi, lowrankFloat32));
  }
  ~OnDevice() {
    cudaSetDevice(dev);
    if (comm) lowrankCommDestroy(comm);
    if (nccl) ncclCommDestroy(nccl);
    cudaStreamDestroy(stream);
    for (void* p : inputs) cudaFree(p);
    cudaFree(out);
  }
};

std::vector<std::vector<float>> inputs() {
  std::vector<std::vector<float>> x;
  for (int c = 0; c < kCalls; ++c) x.push_back(decayingInput(kRows, kCols, 0, 300 + c));
  return x;
}

// Gives the thread's current device back at the end of a test (the next tests make streams on it).
struct KeepDevice {
  int device = 0;
  KeepDevice() { cudaGetDevice(&device); }
  ~KeepDevice() { cudaSetDevice(device); }
};

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(DeviceEngineTwoDevices, EachCommunicatorRunsOnItsNcclCommunicatorsDevice) {
  LR_SKIP_WITHOUT_DEVICE();
  const KeepDevice keep;
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "needs two devices; this machine has " << n;
  const std::vector<std::vector<float>> x = inputs();

  // The reference: one communicator on device 0, called with device 0 current.
  std::vector<std::vector<float>> ref;
  {
    OnDevice one(0, x);
    for (int c = 0; c < kCalls; ++c) {
      ASSERT_EQ(lowrankAllReduce(one.inputs[c], one.out, kCount, lowrankFloat32, lowrankAvg,
                                 one.comm, one.stream), lowrankSuccess)
          << lowrankGetLastError(one.comm);
      ASSERT_EQ(cudaStreamSynchronize(one.stream), cudaSuccess);
      ref.push_back(fromDevice(one.out, kCount, lowrankFloat32));
    }
    expectDeviceEngineRan(one.comm, one.out, kCalls);
  }

  // Communicators on devices 1 and 0, their calls interleaved, each made (the first included, which
  // makes the communicator's device side) with the other device current.
  OnDevice a(1, x), b(0, x);
  for (int c = 0; c < kCalls; ++c) {
    for (OnDevice* d : {&a, &b}) {
      const int other = 1 - d->dev;
      ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
      ASSERT_EQ(lowrankAllReduce(d->inputs[c], d->out, kCount, lowrankFloat32, lowrankAvg,
                                 d->comm, d->stream), lowrankSuccess)
          << "device " << d->dev << ", call " << c << ": " << lowrankGetLastError(d->comm);
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, other) << "the caller's device was not given back";
    }
    for (OnDevice* d : {&a, &b}) {
      ASSERT_EQ(cudaSetDevice(d->dev), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(d->stream), cudaSuccess);
      EXPECT_TRUE(sameBits(fromDevice(d->out, kCount, lowrankFloat32), ref[c]))
          << "device " << d->dev << ", call " << c << ": not the one-device run's output";
    }
  }
  for (OnDevice* d : {&a, &b}) expectDeviceEngineRan(d->comm, d->out, kCalls);
}

}  // namespace
