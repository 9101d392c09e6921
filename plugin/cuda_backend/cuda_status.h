// The CUDA backend's error type (liblowrank's Status stays on its side of the plain-C table): a
// lowrankResult_t, the ncclResult_t of a failed NCCL call, and a message. Written into the table's
// lowrankCudaError_t at the boundary (backend.cc); never logged here (liblowrank logs it once).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdio>
#include <string>

#include "abi/cuda_backend.h"
#include "abi/real_nccl.h"
#include "lowrank/lowrank.h"

namespace lowrank::cuda {

struct Err {
  lowrankResult_t code = lowrankSuccess;
  int ncclResult = 0;  // the NCCL call that failed (msg names it); 0: not NCCL's
  bool refused = false;  // the supplied allocator refused memory (lowrankCommSetAllocator)
  std::string msg;

  bool ok() const { return code == lowrankSuccess; }
  static Err Ok() { return {}; }
  __attribute__((format(printf, 2, 3))) static Err Fail(lowrankResult_t code, const char* fmt, ...) {
    Err e;
    e.code = code;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    e.msg = buf;
    return e;
  }
  // Into the table's error: returns the code.
  int report(lowrankCudaError_t* out) const {
    out->ncclResult = ncclResult;
    out->refused = refused;
    snprintf(out->message, sizeof out->message, "%s", msg.c_str());
    return int(code);
  }
};

inline Err fromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Err::Ok();
  const lowrankResult_t code =
      e == cudaErrorMemoryAllocation ? lowrankSystemError : lowrankUnhandledCudaError;
  return Err::Fail(code, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// An NCCL call's result: liblowrank turns ncclResult into its lowrankResult_t and message, with
// NCCL's own text of the failure (nccl::fromNccl, the one place that reads NCCL's errors).
inline Err fromNccl(int r, const char* what) {
  if (r == 0) return Err::Ok();
  Err e = Err::Fail(lowrankSystemError, "%s", what);
  e.ncclResult = r;
  return e;
}

}  // namespace lowrank::cuda

// Propagates a failed Err to the caller.
#define LR_TRY(expr)                      \
  do {                                    \
    ::lowrank::cuda::Err _err = (expr);   \
    if (!_err.ok()) return _err;          \
  } while (0)
// Evaluates a CUDA call; returns an Err naming it from the enclosing function on failure.
#define LR_CUDA(call) LR_TRY(::lowrank::cuda::fromCuda((call), #call))
