// liblowrank's side of the CUDA backend: loading liblowrank_cuda.so the first time a device
// buffer appears.
#include "engine/device_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "util/log.h"

namespace lowrank {
namespace {

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
