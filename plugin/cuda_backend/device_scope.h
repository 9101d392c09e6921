// The communicator's device, current on the calling thread for one entry of the backend: every
// entry (backend.cc) opens one, so that its streams, events, memory and kernels are the comm's
// device's whatever the caller's current device is, and the caller's is restored after (a GPU
// refuses a kernel or an event record on a stream of a device that is not current).
#pragma once
#include <cuda_runtime_api.h>

#include "cuda_backend/cuda_status.h"

namespace lowrank::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int current = -1;
    if (device < 0 || (cudaGetDevice(&current) == cudaSuccess && current == device)) return;
    status_ = fromCuda(cudaSetDevice(device), "cudaSetDevice (the communicator's device)");
    if (status_.ok()) previous_ = current;
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  // Whether the device could be made current (an entry that may fail returns this first).
  const Err& status() const { return status_; }

 private:
  int previous_ = -1;  // the caller's device, to restore; -1: nothing was changed
  Err status_;
};

}  // namespace lowrank::cuda
