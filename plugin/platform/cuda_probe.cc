#include "platform/cuda_probe.h"

#include <dlfcn.h>

#include <atomic>

#include "util/log.h"

namespace lowrank::platform {
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

}  // namespace

bool isDevicePointer(const void* p) {
  PointerGetAttribute query = driverQuery();
  if (!query) return false;
  unsigned type = 0;
  // Any error (host memory, unknown pointer, driver not initialized) means host memory.
  if (query(&type, kAttrMemoryType, reinterpret_cast<unsigned long long>(p)) != 0) return false;
  return type == kMemTypeDevice;
}

}  // namespace lowrank::platform
