#include "transport/nccl/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "util/log.h"

namespace lowrank::nccl {
namespace {

// The p-prefixed profiling name first (NCCL's own entry, never interposed), else the plain name
// from this library's handle.
template <typename F>
bool resolve(void* h, const char* name, F* fn) {
  std::string p = std::string("p") + name;
  void* s = dlsym(h, p.c_str());
  if (!s) s = dlsym(h, name);
  *fn = reinterpret_cast<F>(s);
  return s != nullptr;
}

Status load(Api* a) {
  const char* env = getenv("LOWRANK_NCCL_LIBRARY");
  a->path = env && *env ? env : "libnccl.so.2";
  a->handle = dlopen(a->path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!a->handle)
    return Status::Error(lowrankSystemError, "cannot load the NCCL library %s%s: %s",
                         a->path.c_str(), env && *env ? " (LOWRANK_NCCL_LIBRARY)" : "", dlerror());
  // lowrank's drop-in libnccl.so.2 forwards to a real NCCL; without one, every forwarded call
  // would end the process: refuse it here with an error instead.
  using Ready = int (*)();
  if (auto ready = reinterpret_cast<Ready>(dlsym(a->handle, "lowrankNcclDropinReady")); ready && !ready())
    return Status::Error(lowrankSystemError,
                         "the NCCL library %s is lowrank's drop-in libnccl.so.2 with no real NCCL "
                         "behind it (set LOWRANK_NCCL_LIBRARY to the real libnccl.so.2 for the "
                         "drop-in, or unset it)", a->path.c_str());
  struct Need { const char* name; bool ok; };
  Need need[] = {
      {"ncclAllReduce", resolve(a->handle, "ncclAllReduce", &a->allReduce)},
      {"ncclGroupStart", resolve(a->handle, "ncclGroupStart", &a->groupStart)},
      {"ncclGroupEnd", resolve(a->handle, "ncclGroupEnd", &a->groupEnd)},
      {"ncclCommCount", resolve(a->handle, "ncclCommCount", &a->commCount)},
      {"ncclCommUserRank", resolve(a->handle, "ncclCommUserRank", &a->commUserRank)},
      {"ncclCommGetAsyncError", resolve(a->handle, "ncclCommGetAsyncError", &a->commGetAsyncError)},
      {"ncclCommDestroy", resolve(a->handle, "ncclCommDestroy", &a->commDestroy)},
      {"ncclCommAbort", resolve(a->handle, "ncclCommAbort", &a->commAbort)},
      {"ncclGetVersion", resolve(a->handle, "ncclGetVersion", &a->getVersion)},
      {"ncclGetErrorString", resolve(a->handle, "ncclGetErrorString", &a->getErrorString)},
  };
  for (const Need& n : need)
    if (!n.ok)
      return Status::Error(lowrankSystemError, "the NCCL library %s has no symbol %s",
                           a->path.c_str(), n.name);
  resolve(a->handle, "ncclCommFinalize", &a->commFinalize);  // optional: NCCL >= 2.14
  resolve(a->handle, "ncclGetLastError", &a->getLastError);  // optional: NCCL >= 2.13
  int v = 0;
  a->getVersion(&v);
  LR_INFO("NCCL transport: %s, NCCL version %d", a->path.c_str(), v);
  return Status::Ok();
}

}  // namespace

Status realNccl(const Api** api) {
  static Api table;
  static Status loaded;
  static std::once_flag once;
  std::call_once(once, [] { loaded = load(&table); });
  if (!loaded.ok()) return loaded;
  *api = &table;
  return Status::Ok();
}

Status fromNccl(const Api& api, Result r, const char* what) {
  if (r == kSuccess) return Status::Ok();
  // ncclUnhandledCudaError 1, ncclSystemError 2, ncclInternalError 3, ncclInvalidArgument 4,
  // ncclInvalidUsage 5, ncclRemoteError 6: the same numbers as lowrankResult_t.
  lowrankResult_t code = r >= 1 && r <= 6 ? lowrankResult_t(r) : lowrankSystemError;
  return Status::Error(code, "%s failed: %s (NCCL error %d)", what,
                       api.getErrorString ? api.getErrorString(r) : "?", r);
}

}  // namespace lowrank::nccl
