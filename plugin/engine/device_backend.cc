// liblowrank's side of the CUDA backend: telling device pointers from host ones without loading
// CUDA, and loading liblowrank_cuda.so the first time a device buffer appears.
#include "engine/device_backend.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "util/log.h"

namespace lowrank {
namespace {

// cuPointerGetAttribute from a libcuda.so.1 that the process has already loaded (a CUDA program
// has; a CPU-only one has not, and then no pointer can be device memory).
using PointerGetAttribute = int (*)(void* data, int attribute, unsigned long long ptr);
constexpr int kAttrMemoryType = 2;   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr unsigned kMemTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE (managed memory reports it too)

// Called by every allreduce (twice for out-of-place): once the driver is found, one atomic load.
// Until then, look again at each call: CUDA may be loaded after liblowrank.
PointerGetAttribute driverQuery() {
  static std::atomic<PointerGetAttribute> found{nullptr};
  if (PointerGetAttribute fn = found.load(std::memory_order_acquire)) return fn;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  auto fn = reinterpret_cast<PointerGetAttribute>(dlsym(h, "cuPointerGetAttribute"));
  // The handle is kept (never closed): the driver must outlive every pointer query.
  PointerGetAttribute none = nullptr;
  if (fn && found.compare_exchange_strong(none, fn, std::memory_order_acq_rel))
    LR_INFO("CUDA driver found: device buffers go to the CUDA backend");
  return fn;
}

std::string backendPath() {
  if (const char* env = getenv("LOWRANK_CUDA_BACKEND"); env && *env) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&deviceBackend), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) return self.substr(0, slash + 1) + "liblowrank_cuda.so";
  }
  return "liblowrank_cuda.so";
}

}  // namespace

bool isDevicePointer(const void* p) {
  PointerGetAttribute query = driverQuery();
  if (!query) return false;
  unsigned type = 0;
  // Any error (host memory, unknown pointer, driver not initialized) means host memory.
  if (query(&type, kAttrMemoryType, reinterpret_cast<unsigned long long>(p)) != 0) return false;
  return type == kMemTypeDevice;
}

Status deviceBackend(const DeviceBackend** out) {
  static const DeviceBackend* backend = nullptr;
  static Status status;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = backendPath();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      status = Status::Error(lowrankSystemError,
                             "device buffer, but the CUDA backend %s could not be loaded: %s "
                             "(build with -Dcuda=enabled; LOWRANK_CUDA_BACKEND names another path)",
                             path.c_str(), dlerror());
      return;
    }
    auto* b = static_cast<const DeviceBackend*>(dlsym(h, "lowrankCudaBackend"));
    if (!b || b->abi != kDeviceBackendAbi) {
      status = Status::Error(lowrankSystemError,
                             "%s is not a lowrank CUDA backend of this version (ABI %d, want %d)",
                             path.c_str(), b ? b->abi : -1, kDeviceBackendAbi);
      return;
    }
    LR_INFO("CUDA backend loaded: %s", path.c_str());
    backend = b;
  });
  if (!status.ok()) return status;
  *out = backend;
  return Status::Ok();
}

}  // namespace lowrank
