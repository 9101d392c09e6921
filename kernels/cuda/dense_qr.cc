#include "kernels/cuda/dense_qr.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#if __has_include(<cusolverDn.h>) && !defined(LOWRANK_CUDA_EMULATION)
#include <cusolverDn.h>

#include <type_traits>
// The function pointer types of DenseQrApi are cuSOLVER's with the handle made opaque and the
// status enum an int.
namespace {
template <typename T> struct Opaque { using type = T; };
template <> struct Opaque<cusolverDnHandle_t> { using type = void*; };
template <> struct Opaque<cusolverDnHandle_t*> { using type = void**; };
template <typename R, typename... A>
auto opaque(R (*)(A...)) -> int (*)(typename Opaque<A>::type...);
using Api = lowrank::cuda::detail::DenseQrApi;
static_assert(std::is_same_v<decltype(opaque(&cusolverDnCreate)), decltype(Api::create)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnDestroy)), decltype(Api::destroy)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnSetStream)), decltype(Api::setStream)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnDgeqrf_bufferSize)),
                             decltype(Api::geqrfBufferSize)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnDgeqrf)), decltype(Api::geqrf)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnDorgqr_bufferSize)),
                             decltype(Api::orgqrBufferSize)>);
static_assert(std::is_same_v<decltype(opaque(&cusolverDnDorgqr)), decltype(Api::orgqr)>);
static_assert(sizeof(cusolverStatus_t) == sizeof(int) && CUSOLVER_STATUS_SUCCESS == 0);
}  // namespace
#endif

namespace lowrank::cuda::detail {
namespace {

template <typename F>
bool resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

std::string load(DenseQrApi* api) {
  const char* env = std::getenv("LOWRANK_CUSOLVER_LIBRARY");
  void* lib = nullptr;
  std::string tried;
  if (env && *env) {
    lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    tried = std::string(env) + " (LOWRANK_CUSOLVER_LIBRARY)";
  } else {
    for (const char* name : {"libcusolver.so.12", "libcusolver.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      tried += tried.empty() ? name : std::string(", ") + name;
      if (lib) break;
    }
  }
  if (!lib) {
    const char* err = dlerror();
    return "cannot load " + tried + ": " + (err ? err : "not found");
  }
  const bool ok = resolve(lib, "cusolverDnCreate", &api->create) &&
                  resolve(lib, "cusolverDnDestroy", &api->destroy) &&
                  resolve(lib, "cusolverDnSetStream", &api->setStream) &&
                  resolve(lib, "cusolverDnDgeqrf_bufferSize", &api->geqrfBufferSize) &&
                  resolve(lib, "cusolverDnDgeqrf", &api->geqrf) &&
                  resolve(lib, "cusolverDnDorgqr_bufferSize", &api->orgqrBufferSize) &&
                  resolve(lib, "cusolverDnDorgqr", &api->orgqr);
  if (!ok) {
    dlclose(lib);
    return tried + " lacks the cusolverDn QR entry points";
  }
  return {};  // kept loaded for the life of the process
}

}  // namespace

const DenseQrApi* denseQrApi(const char** why) {
  static DenseQrApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] { error = load(&api); });
  if (why) *why = error.empty() ? nullptr : error.c_str();
  return error.empty() ? &api : nullptr;
}

}  // namespace lowrank::cuda::detail
