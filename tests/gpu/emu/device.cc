// The emulated devices themselves: two, 0 and 1, named "CPU emulation", one current per thread;
// errors and their names.
#include <cstdlib>
#include <cstring>

#include "runtime.h"
#include "sync_calls.h"

namespace emu {
namespace {
thread_local cudaError_t lastError = cudaSuccess;
thread_local int current = 0;  // cudaSetDevice's, per thread as in CUDA
}  // namespace

int currentDevice() { return current; }

cudaError_t setError(cudaError_t e) {
  if (e != cudaSuccess) lastError = e;
  return e;
}

namespace {
std::mutex syncMu;
SyncCalls& counts() {
  static auto* c = new SyncCalls;  // never destroyed: counted until exit
  return *c;
}
}  // namespace

void syncCallsReset() {
  std::lock_guard<std::mutex> lock(syncMu);
  counts().clear();
}

SyncCalls syncCalls() {
  std::lock_guard<std::mutex> lock(syncMu);
  return counts();
}

void countSync(const char* kind) {
  std::lock_guard<std::mutex> lock(syncMu);
  ++counts()[{kind, std::this_thread::get_id()}];
}

}  // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return setError(cudaErrorInvalidValue);
  *n = kDevices;
  return cudaSuccess;
}

// The emulated device's memory is the host's: no figure to give (the memory-pressure check runs on
// GPUs only).
cudaError_t cudaMemGetInfo(size_t*, size_t*) { return setError(cudaErrorNotSupported); }

cudaError_t cudaGetDevice(int* d) {
  if (!d) return setError(cudaErrorInvalidValue);
  *d = current;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= kDevices) return setError(cudaErrorInvalidDevice);
  current = d;
  return cudaSuccess;
}

// Stream-ordered allocation is supported unless LOWRANK_EMU_NO_MEMORY_POOLS=1 (as on a GPU or
// driver without memory pools: the CUDA backend then allocates synchronously).
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
  if (!value) return setError(cudaErrorInvalidValue);
  if (d < 0 || d >= kDevices) return setError(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMemoryPoolsSupported) return setError(cudaErrorInvalidValue);
  const char* off = std::getenv("LOWRANK_EMU_NO_MEMORY_POOLS");
  *value = off && std::strcmp(off, "1") == 0 ? 0 : 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p) return setError(cudaErrorInvalidValue);
  if (d < 0 || d >= kDevices) return setError(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "CPU emulation (tests/gpu/emu)");
  p->multiProcessorCount = 1;
  p->totalGlobalMem = size_t(1) << 34;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = lastError;
  lastError = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return lastError; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorNotReady: return "device not ready (emulated)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated: memory of another device)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (emulated)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (emulated)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (emulated)";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream (emulated)";
    default: return "unknown error (emulated)";
  }
}

}  // extern "C"
