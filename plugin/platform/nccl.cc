#include "platform/nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "util/log.h"

namespace lowrank::nccl {
namespace {

Status missingSymbol(const std::string& path, const char* name) {
  const char* env = getenv("LOWRANK_NCCL_LIBRARY");
  return Status::Error(lowrankSystemError, "the NCCL library %s%s has no symbol %s", path.c_str(),
                       env && *env ? " (LOWRANK_NCCL_LIBRARY)" : "", name);
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
      {"ncclAllReduce", resolveEntry(a->handle, "ncclAllReduce", &a->allReduce)},
      {"ncclGroupStart", resolveEntry(a->handle, "ncclGroupStart", &a->groupStart)},
      {"ncclGroupEnd", resolveEntry(a->handle, "ncclGroupEnd", &a->groupEnd)},
      {"ncclCommCount", resolveEntry(a->handle, "ncclCommCount", &a->commCount)},
      {"ncclCommUserRank", resolveEntry(a->handle, "ncclCommUserRank", &a->commUserRank)},
      {"ncclCommGetAsyncError", resolveEntry(a->handle, "ncclCommGetAsyncError", &a->commGetAsyncError)},
      {"ncclCommDestroy", resolveEntry(a->handle, "ncclCommDestroy", &a->commDestroy)},
      {"ncclCommAbort", resolveEntry(a->handle, "ncclCommAbort", &a->commAbort)},
      {"ncclGetVersion", resolveEntry(a->handle, "ncclGetVersion", &a->getVersion)},
      {"ncclGetErrorString", resolveEntry(a->handle, "ncclGetErrorString", &a->getErrorString)},
  };
  for (const Need& n : need)
    if (!n.ok) return missingSymbol(a->path, n.name);
  resolveEntry(a->handle, "ncclCommFinalize", &a->commFinalize);  // optional: NCCL >= 2.14
  resolveEntry(a->handle, "ncclGetLastError", &a->getLastError);  // optional: NCCL >= 2.13
  // Optional for the transport; lowrankCommInitNcclRank checks them (requireEntry).
  resolveEntry(a->handle, "ncclGetUniqueId", &a->getUniqueId);
  resolveEntry(a->handle, "ncclCommInitRank", &a->commInitRank);
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

Status requireEntry(const Api& api, bool resolved, const char* name) {
  return resolved ? Status::Ok() : missingSymbol(api.path, name);
}

Status fromNccl(const Api& api, Result r, const char* what) {
  if (r == kSuccess) return Status::Ok();
  // ncclUnhandledCudaError 1, ncclSystemError 2, ncclInternalError 3, ncclInvalidArgument 4,
  // ncclInvalidUsage 5, ncclRemoteError 6: the same numbers as lowrankResult_t.
  lowrankResult_t code = r >= 1 && r <= 6 ? lowrankResult_t(r) : lowrankSystemError;
  // NCCL's own text of the failure, where the library keeps one (NCCL >= 2.13; per thread, the
  // comm argument unused).
  const char* last = api.getLastError ? api.getLastError(nullptr) : nullptr;
  return Status::Error(code, "%s failed: %s (NCCL error %d)%s%s", what,
                       api.getErrorString ? api.getErrorString(r) : "?", r,
                       last && *last ? ": " : "", last && *last ? last : "");
}

}  // namespace lowrank::nccl
