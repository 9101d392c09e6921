// The real NCCL behind the shim, reached through its own symbols so that nothing the shim calls
// is ever interposed again: the p-prefixed profiling name (pncclAllReduce, ...) where the library
// exports one, else the plain name looked up in that library.
//
// Which library (resolved once per process):
//   LD_PRELOAD shim (liblowrank_nccl.so): LOWRANK_NCCL_LIBRARY when set, else the libnccl.so.2
//     already loaded in the process, else the next definitions after the shim (dlsym(RTLD_NEXT)).
//     lowrank's NCCL transport opens the same library (LOWRANK_NCCL_LIBRARY, else libnccl.so.2).
//   Drop-in libnccl.so.2 (built with LOWRANK_SHIM_DROPIN): LOWRANK_NCCL_LIBRARY, required; a
//     clear error when it is unset, cannot be loaded, or names the drop-in itself.
// Thread safety: real() and realHandle() are safe from any thread; the table never changes once made.
#pragma once
#include <nccl.h>

#include <string>

namespace lowrank::shim {

struct Real {
  void* handle = nullptr;  // dlopen handle, or RTLD_NEXT
  std::string path;        // what was opened, for messages
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  ncclResult_t (*groupSimulateEnd)(ncclSimInfo_t*) = nullptr;  // optional (NCCL >= 2.22)
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*commFinalize)(ncclComm_t) = nullptr;  // optional (NCCL >= 2.14)
  ncclResult_t (*commCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*commUserRank)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*commCuDevice)(const ncclComm_t, int*) = nullptr;  // optional
  ncclResult_t (*redOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t,
                                       ncclComm_t) = nullptr;      // optional (NCCL >= 2.11)
  ncclResult_t (*redOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;  // optional (NCCL >= 2.11)
  ncclResult_t (*getVersion)(int*) = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;  // optional (NCCL >= 2.13)
};

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
