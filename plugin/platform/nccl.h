// The real NCCL, reached through its own exported symbols and never through the global scope, so
// that the LD_PRELOAD shim (plugin/nccl_shim), which interposes ncclAllReduce, never sees
// lowrank's own factor allreduces. One table per process, used by the NCCL transport, the API
// (lowrankCommInitNcclRank), the shim and the CUDA backend (the last two through
// lowrankServices_t.realNccl).
//
// Which library, in this order:
//   1. the one LOWRANK_NCCL_LIBRARY names (an error when it cannot be loaded);
//   2. a libnccl.so.2 the process has loaded already;
//   3. any other library the process has loaded that defines NCCL's entry points itself (an NCCL
//      linked into a framework's library);
//   4. a PyPI NCCL wheel (nvidia-nccl-cu12, -cu13: where torch's wheels get theirs):
//      nvidia/nccl/lib/libnccl.so.2 under each folder of LOWRANK_NCCL_WHEEL_PATH (':'-separated;
//      the Python package sets it to sys.path when unset), looked at only when 1 to 3 found none,
//      so a process that has loaded torch's NCCL uses that one;
//   5. libnccl.so.2, loaded now by the dynamic loader's search.
// A library that is lowrank's own shim (the LD_PRELOAD one, or the drop-in libnccl.so.2) is never
// taken: its calls would come back to lowrank. Each entry point is its p-prefixed profiling name
// (pncclAllReduce, ...) where the library exports one, else the plain name in that library.
// Thread safety: realNccl() is safe to call from any thread; the table is immutable once made.
#pragma once
#include <dlfcn.h>

#include <cstddef>
#include <string>

#include "abi/nccl_settle.h"
#include "abi/real_nccl.h"
#include "util/status.h"

namespace lowrank::nccl {

// ncclResult_t values (stable since NCCL 2.0; lowrank's dtype and op enums use NCCL's numbers).
using Result = int;
constexpr Result kSuccess = 0, kInProgress = LOWRANK_NCCL_IN_PROGRESS;

using UniqueId = lowrankNcclUniqueId_t;
using Api = lowrankRealNccl_t;

// The symbol every lowrank shim exports (the LD_PRELOAD shim and the drop-in): a library that
// defines it is never taken for the real NCCL.
constexpr const char* kShimMarker = "lowrankNcclShimMarker";

// The real library's entry points, resolved once per process. Errors: lowrankSystemError naming
// the library and the symbol that could not be found (and LOWRANK_NCCL_LIBRARY when it was set).
Status realNccl(const Api** api);

// Where realNccl's library was found: "LOWRANK_NCCL_LIBRARY", "loaded by the process", "PyPI
// wheel" or "dynamic loader" (steps 1 to 5 above); with the Status of realNccl (loads it if needed).
Status realNcclSource(const Api** api, const char** source);

// An optional entry point that a caller needs (`resolved`: its pointer in Api is not null): Ok, or
// the same lowrankSystemError as a missing required one, naming the library and `name`.
Status requireEntry(const Api& api, bool resolved, const char* name);

// "ncclAllReduce failed: <NCCL's error string> (<code>)" as a lowrank Status
// (lowrankRemoteError for ncclRemoteError, lowrankInvalidUsage/InvalidArgument for those, else
// lowrankSystemError). r is a settled result: ncclInProgress here is a call still in progress when
// its timeout ran out (lowrankNcclSettle), lowrankTimeout naming the call.
Status fromNccl(const Api& api, Result r, const char* what);

// The Status of NCCL call `what` on comm that returned r, once it is done: r waited out by
// lowrankNcclSettle (abi/nccl_settle.h) for at most timeoutSec, then fromNccl. Every NCCL call of
// liblowrank goes through it (comm null: a call with no comm left to poll).
inline Status settle(const Api& api, void* comm, Result r, double timeoutSec, const char* what) {
  return fromNccl(api, lowrankNcclSettle(&api, comm, r, timeoutSec), what);
}

}  // namespace lowrank::nccl
