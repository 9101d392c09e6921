// The real NCCL behind the shim: liblowrank's one table of it per process (plugin/platform/nccl.h
// gives the order in which the library is found, and refuses lowrank's own shims), reached
// through lowrankServices_t.realNccl. The drop-in libnccl.so.2 (built with LOWRANK_SHIM_DROPIN)
// also requires LOWRANK_NCCL_LIBRARY: a clear error when it is unset.
// Thread safety: every function is safe from any thread; the table never changes once made.
#pragma once
#include "abi/real_nccl.h"

namespace lowrank::shim {

using Real = lowrankRealNccl_t;

// The real library's entry points; null when it cannot be reached, after printing why (once, at
// WARN, whatever LOWRANK_DEBUG says). The entry points then return ncclSystemError.
const Real* real();

// Why real() is null ("" when it is not), for ncclGetLastError.
const char* realError();

// real() if the library has been looked up already, else null; never starts the lookup (safe
// while it runs, e.g. from the error report of a failed lookup).
const Real* realIfLoaded();

// The handle of the real library for the drop-in's forwarders; null as real().
void* realHandle();

// Name of this build of the shim in messages: "LD_PRELOAD shim" or "drop-in libnccl.so.2".
const char* shimMode();

}  // namespace lowrank::shim
