#include "platform/nccl.h"

#include <dlfcn.h>
#include <link.h>

#include <unistd.h>

#include <mutex>

#include "util/env.h"
#include "util/log.h"

namespace lowrank::nccl {
namespace {

const char* libraryEnv() { return env::get("LOWRANK_NCCL_LIBRARY"); }

Status missingSymbol(const char* path, const char* name) {
  return Status::Error(lowrankSystemError, "the NCCL library %s%s has no symbol %s", path,
                       libraryEnv() ? " (LOWRANK_NCCL_LIBRARY)" : "", name);
}

// *fn = the p-prefixed profiling entry of `name` in the library `handle` (NCCL's own, never
// interposed), else the plain name in that library; false if it has neither.
template <typename F>
bool resolve(void* handle, const char* name, F* fn) {
  void* s = dlsym(handle, (std::string("p") + name).c_str());
  if (!s) s = dlsym(handle, name);
  *fn = reinterpret_cast<F>(s);
  return s != nullptr;
}

bool isShim(void* handle) { return dlsym(handle, kShimMarker) != nullptr; }

// Step 3 of the order: a loaded library (not lowrank's, not a dependency's definition) that
// defines ncclGetVersion itself. Returns a handle of it (a reference the caller keeps), or null.
void* findLoadedNccl(std::string* path) {
  struct Found { void* handle; std::string path; } found{nullptr, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* f = static_cast<Found*>(data);
        if (!info->dlpi_name || !*info->dlpi_name) return 0;  // the program itself, the vDSO
        void* h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) return 0;
        Dl_info where{};
        void* s = dlsym(h, "ncclGetVersion");
        if (s && !isShim(h) && dladdr(s, &where) && where.dli_fbase == reinterpret_cast<void*>(info->dlpi_addr)) {
          f->handle = h;
          f->path = info->dlpi_name;
          return 1;
        }
        dlclose(h);
        return 0;
      },
      &found);
  *path = found.path;
  return found.handle;
}

// Step 4: nvidia/nccl/lib/libnccl.so.2 under the folders of LOWRANK_NCCL_WHEEL_PATH, the first
// that loads. A file there that does not load is noted in *tried and passed over.
void* openFromWheel(std::string* path, std::string* tried) {
  const char* v = env::get("LOWRANK_NCCL_WHEEL_PATH");
  if (!v) return nullptr;
  std::string dirs = v;
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    start = end + 1;
    if (dir.empty()) continue;
    const std::string candidate = dir + "/nvidia/nccl/lib/libnccl.so.2";
    if (access(candidate.c_str(), F_OK) != 0) continue;
    if (void* h = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *path = candidate;
      return h;
    }
    *tried += "; " + candidate + ": " + dlerror();
  }
  return nullptr;
}

const char* g_source = "";  // where open() found the library (set once, under realNccl's once)

Status open(void** handle, std::string* path) {
  if (const char* env = libraryEnv()) {
    g_source = "LOWRANK_NCCL_LIBRARY";
    *path = env;
    *handle = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!*handle)
      return Status::Error(lowrankSystemError, "cannot load LOWRANK_NCCL_LIBRARY=%s: %s", env, dlerror());
    return Status::Ok();
  }
  *path = "libnccl.so.2";
  g_source = "loaded by the process";
  if ((*handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) && !isShim(*handle)) return Status::Ok();
  if (*handle) dlclose(*handle);
  if ((*handle = findLoadedNccl(path))) return Status::Ok();
  std::string tried;
  g_source = "PyPI wheel";
  if ((*handle = openFromWheel(path, &tried))) return Status::Ok();
  g_source = "dynamic loader";
  *path = "libnccl.so.2";
  *handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!*handle)
    return Status::Error(lowrankSystemError,
                         "cannot load the NCCL library libnccl.so.2: %s%s (no NCCL loaded by the "
                         "process, none under LOWRANK_NCCL_WHEEL_PATH's nvidia/nccl/lib; "
                         "LOWRANK_NCCL_LIBRARY names one)",
                         dlerror(), tried.c_str());
  return Status::Ok();
}

Status load(Api* a, std::string* path) {
  void* h = nullptr;
  LR_RETURN_IF_ERROR(open(&h, path));
  a->handle = h;
  a->path = path->c_str();
  // lowrank's own shim is not the real NCCL: every call would come back to lowrank.
  if (isShim(h))
    return Status::Error(lowrankSystemError,
                         "%s is the lowrank shim itself, not the real NCCL library (%s)",
                         path->c_str(),
                         libraryEnv() ? "LOWRANK_NCCL_LIBRARY must name the real libnccl.so.2"
                                      : "set LOWRANK_NCCL_LIBRARY to the real libnccl.so.2");
  struct Need { const char* name; bool ok; };
  const Need need[] = {
      {"ncclAllReduce", resolve(h, "ncclAllReduce", &a->allReduce)},
      {"ncclGroupStart", resolve(h, "ncclGroupStart", &a->groupStart)},
      {"ncclGroupEnd", resolve(h, "ncclGroupEnd", &a->groupEnd)},
      {"ncclCommCount", resolve(h, "ncclCommCount", &a->commCount)},
      {"ncclCommUserRank", resolve(h, "ncclCommUserRank", &a->commUserRank)},
      {"ncclCommGetAsyncError", resolve(h, "ncclCommGetAsyncError", &a->commGetAsyncError)},
      {"ncclCommDestroy", resolve(h, "ncclCommDestroy", &a->commDestroy)},
      {"ncclCommAbort", resolve(h, "ncclCommAbort", &a->commAbort)},
      {"ncclGetVersion", resolve(h, "ncclGetVersion", &a->getVersion)},
      {"ncclGetErrorString", resolve(h, "ncclGetErrorString", &a->getErrorString)},
  };
  for (const Need& n : need)
    if (!n.ok) return missingSymbol(path->c_str(), n.name);
  // Optional: null where the library predates them (real_nccl.h names the versions).
  resolve(h, "ncclGroupSimulateEnd", &a->groupSimulateEnd);
  resolve(h, "ncclCommCuDevice", &a->commCuDevice);
  resolve(h, "ncclCommFinalize", &a->commFinalize);
  resolve(h, "ncclRedOpCreatePreMulSum", &a->redOpCreatePreMulSum);
  resolve(h, "ncclRedOpDestroy", &a->redOpDestroy);
  resolve(h, "ncclGetUniqueId", &a->getUniqueId);
  resolve(h, "ncclCommInitRank", &a->commInitRank);
  resolve(h, "ncclGetLastError", &a->getLastError);
  // The file itself, not the soname the loader was asked for: what `python -m lowrank` reports.
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(a->getVersion), &where) && where.dli_fname && *where.dli_fname)
    *path = where.dli_fname;
  a->path = path->c_str();
  int v = 0;
  a->getVersion(&v);
  LR_INFO("real NCCL: %s (%s), version %d", path->c_str(), g_source, v);
  return Status::Ok();
}

}  // namespace

Status realNcclSource(const Api** api, const char** source) {
  LR_RETURN_IF_ERROR(realNccl(api));
  *source = g_source;
  return Status::Ok();
}

Status realNccl(const Api** api) {
  static Api table{};
  static std::string path;
  static Status loaded;
  static std::once_flag once;
  std::call_once(once, [] { loaded = load(&table, &path); });
  if (!loaded.ok()) return loaded;
  *api = &table;
  return Status::Ok();
}

Status requireEntry(const Api& api, bool resolved, const char* name) {
  return resolved ? Status::Ok() : missingSymbol(api.path, name);
}

Status fromNccl(const Api& api, Result r, const char* what) {
  if (r == kSuccess) return Status::Ok();
  if (r == kInProgress)
    return Status::Error(lowrankTimeout,
                         "%s: still in progress (ncclInProgress, a nonblocking NCCL communicator) "
                         "when the communicator's timeout ran out (lowrankConfig_t.timeoutSec, "
                         "LOWRANK_TIMEOUT)", what);
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
