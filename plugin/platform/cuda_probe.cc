#include "platform/cuda_probe.h"

#include <dlfcn.h>

#include <atomic>

#include "util/log.h"

namespace lowrank::platform {
namespace {

// cuPointerGetAttribute from a libcuda.so.1 that the process has already loaded.
using PointerGetAttribute = int (*)(void* data, int attribute, unsigned long long ptr);
constexpr int kAttrMemoryType = 2;      // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
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

// The CUDA runtime calls liblowrank makes: in the global scope (a program linked with libcudart),
// else in a libcudart that some library loaded privately, else in the driver's library (the CPU
// emulation of CUDA keeps its runtime there). Never loads one. Looked up again until found.
struct Runtime {
  int (*streamQuery)(void* stream) = nullptr;  // cudaSuccess 0, cudaErrorNotReady 600
  int (*streamIsCapturing)(void* stream, int* status) = nullptr;  // cudaStreamCaptureStatus
  int (*getDevice)(int* device) = nullptr;
  int (*setDevice)(int device) = nullptr;
};

const Runtime* runtime() {
  static std::atomic<const Runtime*> found{nullptr};
  if (const Runtime* rt = found.load(std::memory_order_acquire)) return rt;
  // RTLD_DEFAULT is a null handle: whether one was found is told apart by `have`.
  void* h = RTLD_DEFAULT;
  bool have = dlsym(h, "cudaStreamQuery") != nullptr;
  for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
                         "libcuda.so.1"}) {
    if (have) break;
    h = dlopen(so, RTLD_LAZY | RTLD_NOLOAD);
    have = h && dlsym(h, "cudaStreamQuery");
  }
  if (!have) return nullptr;
  auto* rt = new Runtime();  // published once, never freed
  rt->streamQuery = reinterpret_cast<int (*)(void*)>(dlsym(h, "cudaStreamQuery"));
  rt->streamIsCapturing = reinterpret_cast<int (*)(void*, int*)>(dlsym(h, "cudaStreamIsCapturing"));
  rt->getDevice = reinterpret_cast<int (*)(int*)>(dlsym(h, "cudaGetDevice"));
  rt->setDevice = reinterpret_cast<int (*)(int)>(dlsym(h, "cudaSetDevice"));
  const Runtime* none = nullptr;
  if (!found.compare_exchange_strong(none, rt, std::memory_order_acq_rel)) {
    delete rt;
    return none;
  }
  return rt;
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

bool streamCapturing(void* stream) {
  const Runtime* rt = runtime();
  int status = 0;  // cudaStreamCaptureStatusNone
  return rt && rt->streamIsCapturing && rt->streamIsCapturing(stream, &status) == 0 && status != 0;
}

int streamQuery(void* stream) {
  const Runtime* rt = runtime();
  return rt && rt->streamQuery ? rt->streamQuery(stream) : -1;
}

int DeviceGuard::enterDevice(int device) {
  const Runtime* rt = runtime();
  int current = -1;
  if (device < 0 || !rt || !rt->getDevice || !rt->setDevice || rt->getDevice(&current) != 0 ||
      current == device || rt->setDevice(device) != 0)
    return -1;
  return current;
}

void DeviceGuard::leaveDevice(int previous) {
  if (previous < 0) return;
  if (const Runtime* rt = runtime(); rt && rt->setDevice) rt->setDevice(previous);
}

}  // namespace lowrank::platform
