// The CPU emulation's two devices (tests/gpu/emu/runtime.h): a current device per thread, and the
// rules a GPU enforces that the two-device engine test (test_cuda_devices.cc) relies on to show a
// wrong device: a kernel on a stream of a device that is not current, a kernel given memory of
// another device, an event recorded on another device's stream. Emulation only.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <thread>

#include "gpu/device_support.h"
#include "host_work.h"

namespace {

TEST(EmulatedTwoDevices, CurrentDeviceIsPerThread) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  int other = -1;
  std::thread([&] { cudaGetDevice(&other); }).join();
  EXPECT_EQ(other, 0) << "a new thread starts on device 0, as in CUDA";
  int here = -1;
  ASSERT_EQ(cudaGetDevice(&here), cudaSuccess);
  EXPECT_EQ(here, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(EmulatedTwoDevices, WorkOfTheWrongDeviceIsAnError) {
  void* mem[2];
  cudaStream_t stream[2];
  cudaEvent_t event[2];
  for (int d : {0, 1}) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&mem[d], 64), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream[d]), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&event[d]), cudaSuccess);
    EXPECT_EQ(emu::pointerDevice(mem[d]), d);
    EXPECT_EQ(emu::streamDevice(stream[d]), d);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(emu::streamDevice(nullptr), 0) << "the legacy stream is the current device's";
  // A kernel's parameters as its launch copies them.
  struct Params {
    int n;
    void* p;
  };
  const Params own{8, mem[0]}, foreign{8, mem[1]};
  EXPECT_EQ(emu::checkKernelLaunch(stream[0], &own, sizeof own), cudaSuccess);
  EXPECT_EQ(emu::checkKernelLaunch(nullptr, &own, sizeof own), cudaSuccess);
  EXPECT_EQ(emu::checkKernelLaunch(stream[1], &own, sizeof own), cudaErrorInvalidResourceHandle)
      << "a stream of device 1 while device 0 is current";
  EXPECT_EQ(emu::checkKernelLaunch(stream[0], &foreign, sizeof foreign), cudaErrorIllegalAddress)
      << "memory of device 1 given to a kernel on device 0";
  EXPECT_EQ(cudaEventRecord(event[1], stream[0]), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(event[0], stream[0]), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(stream[1], event[0], 0), cudaSuccess) << "waits may cross devices";
  (void)cudaGetLastError();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int d : {0, 1}) {
    cudaEventDestroy(event[d]);
    cudaStreamDestroy(stream[d]);
    cudaFree(mem[d]);
  }
}

}  // namespace
