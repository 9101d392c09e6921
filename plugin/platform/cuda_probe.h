// Questions about CUDA that liblowrank answers without linking or loading any CUDA library: only
// the CUDA libraries the process has already loaded are consulted (a CUDA program has them; a
// CPU-only one has not, and then every answer is "host", "not capturing", "no device"). The one
// place liblowrank, the NCCL shim and the CUDA backend (through lowrankServices_t) probe CUDA.
// Thread-safe.
#pragma once

namespace lowrank::platform {

// True if p is device memory (CU_MEMORYTYPE_DEVICE; managed memory reports it too) of a CUDA
// driver already loaded in this process; false without a driver, for host or unknown pointers.
bool isDevicePointer(const void* p);

// True if `stream` (a cudaStream_t; null: the legacy default stream) is being captured into a
// CUDA graph (cudaStreamIsCapturing of the process's CUDA runtime); false without a runtime.
// Makes no other CUDA call, so it is safe during capture.
bool streamCapturing(void* stream);

// cudaStreamQuery of the process's CUDA runtime: 0 when `stream`'s work is done, 600
// (cudaErrorNotReady) while it runs, another CUDA error code on failure; -1 without a runtime.
int streamQuery(void* stream);

// Makes `device` current on this thread for the guard's lifetime, and restores the caller's device
// after. Does nothing for device < 0 or without a CUDA runtime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : previous_(enterDevice(device)) {}
  ~DeviceGuard() { leaveDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // The guard's two halves, for callers across a C boundary: enterDevice returns the device to
  // give leaveDevice (-1 when nothing was changed).
  static int enterDevice(int device);
  static void leaveDevice(int previous);

 private:
  int previous_;
};

}  // namespace lowrank::platform
