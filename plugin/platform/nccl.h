// The real NCCL, reached through its own exported symbols and never through the global scope, so
// that the LD_PRELOAD shim (plugin/nccl_shim), which interposes ncclAllReduce, never sees the
// library's own factor allreduces. Resolution: the library named by LOWRANK_NCCL_LIBRARY, else
// "libnccl.so.2" (already loaded in an NCCL program); each entry point is its p-prefixed profiling
// name (pncclAllReduce, ...) where the library exports one, else the plain name looked up in that
// library's handle (dlsym(handle, ...), not RTLD_DEFAULT).
// Types are NCCL's, passed as plain ints and opaque pointers, so this header needs no nccl.h.
// Thread safety: realNccl() is safe to call from any thread; the table is immutable once made.
#pragma once
#include <dlfcn.h>

#include <cstddef>
#include <string>

#include "util/status.h"

namespace lowrank::nccl {

// ncclResult_t, ncclDataType_t, ncclRedOp_t values (stable since NCCL 2.0; lowrank's dtype and op
// enums use the same numbers).
using Result = int;
constexpr Result kSuccess = 0, kInProgress = 7;

// ncclUniqueId's layout (NCCL_UNIQUE_ID_BYTES = 128 since NCCL 2.0), passed by value as NCCL does.
struct UniqueId {
  char internal[128];
};

struct Api {
  void* handle = nullptr;  // dlopen handle of the real library
  std::string path;        // what was opened
  Result (*allReduce)(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                      void* stream) = nullptr;
  Result (*groupStart)() = nullptr;
  Result (*groupEnd)() = nullptr;
  Result (*commCount)(const void* comm, int* count) = nullptr;
  Result (*commUserRank)(const void* comm, int* rank) = nullptr;
  Result (*commGetAsyncError)(void* comm, Result* asyncError) = nullptr;
  Result (*commDestroy)(void* comm) = nullptr;
  Result (*commAbort)(void* comm) = nullptr;
  Result (*commFinalize)(void* comm) = nullptr;    // null before NCCL 2.14
  // Optional here (lowrankNcclGetUniqueId and lowrankCommInitNcclRank need them; the transport
  // does not): null when the library lacks them, see requireEntry.
  Result (*getUniqueId)(UniqueId* id) = nullptr;
  Result (*commInitRank)(void** comm, int nranks, UniqueId id, int rank) = nullptr;
  Result (*getVersion)(int* version) = nullptr;
  const char* (*getErrorString)(Result) = nullptr;
  const char* (*getLastError)(void* comm) = nullptr;  // null before NCCL 2.13
};

// *fn = the p-prefixed profiling entry of `name` in the library `handle` (NCCL's own, never
// interposed), else the plain name in that library; false if it has neither. Also the shim's.
template <typename F>
bool resolveEntry(void* handle, const char* name, F* fn) {
  void* s = dlsym(handle, (std::string("p") + name).c_str());
  if (!s) s = dlsym(handle, name);
  *fn = reinterpret_cast<F>(s);
  return s != nullptr;
}

// The real library's entry points, resolved once per process. Errors: lowrankSystemError naming
// the library and the symbol that could not be found (and LOWRANK_NCCL_LIBRARY when it was set).
Status realNccl(const Api** api);

// An optional entry point that a caller needs (`resolved`: its pointer in Api is not null): Ok, or
// the same lowrankSystemError as a missing required one, naming the library and `name`.
Status requireEntry(const Api& api, bool resolved, const char* name);

// "ncclAllReduce failed: <NCCL's error string> (<code>)" as a lowrank Status
// (lowrankRemoteError for ncclRemoteError, lowrankInvalidUsage/InvalidArgument for those, else
// lowrankSystemError).
Status fromNccl(const Api& api, Result r, const char* what);

}  // namespace lowrank::nccl
