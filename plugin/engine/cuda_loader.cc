// The loader of the CUDA library, liblowrank_cuda.so, the first time a device buffer appears.
#include "engine/cuda_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "util/env.h"
#include "util/log.h"

namespace lowrank {
namespace {

std::string backendPath() {
  if (const char* v = env::get("LOWRANK_CUDA_BACKEND")) return v;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&loadCudaBackend), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) return self.substr(0, slash + 1) + "liblowrank_cuda.so";
  }
  return "liblowrank_cuda.so";
}

// The version of the table a library exports, for the message: the newest of the symbols
// lowrankCudaBackendV<n> it has (a table starts with its version), else that of the C++ table
// of versions 1 and 2 (`lowrankCudaBackend`, an int first), or -1 for none.
int exportedVersion(void* h) {
  for (int v = LOWRANK_CUDA_BACKEND_VERSION + 8; v >= 1; --v) {
    const std::string name = "lowrankCudaBackendV" + std::to_string(v);
    if (const auto* t = static_cast<const lowrankCudaBackend_t*>(dlsym(h, name.c_str())))
      return int(t->version);
  }
  if (const auto* legacy = static_cast<const int*>(dlsym(h, "lowrankCudaBackend"))) return *legacy;
  return -1;
}

}  // namespace

Status loadCudaBackend(const lowrankCudaBackend_t** out) {
  static const lowrankCudaBackend_t* backend = nullptr;
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
    const auto* b = static_cast<const lowrankCudaBackend_t*>(dlsym(h, LOWRANK_CUDA_BACKEND_SYMBOL));
    if (!b || b->version != LOWRANK_CUDA_BACKEND_VERSION || b->size < sizeof(lowrankCudaBackend_t)) {
      const int found = b ? int(b->version) : exportedVersion(h);
      status = Status::Error(lowrankSystemError,
                             "%s is not a lowrank CUDA backend of this version: it has table "
                             "version %d%s, this liblowrank needs version %d (%s); use the "
                             "liblowrank_cuda.so built with this liblowrank",
                             path.c_str(), found, found < 0 ? " (none)" : "",
                             LOWRANK_CUDA_BACKEND_VERSION, LOWRANK_CUDA_BACKEND_SYMBOL);
      dlclose(h);
      return;
    }
    LR_INFO("CUDA backend loaded: %s (table version %u)", path.c_str(), b->version);
    backend = b;
  });
  if (!status.ok()) return status;
  *out = backend;
  return Status::Ok();
}

}  // namespace lowrank
