// CUDA and NCCL errors as lowrank Status values, for the CUDA backend.
#pragma once
#include <cuda_runtime_api.h>

#include "util/status.h"

namespace lowrank::cuda {

inline Status fromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  const lowrankResult_t code =
      e == cudaErrorMemoryAllocation ? lowrankSystemError : lowrankUnhandledCudaError;
  return Status::Error(code, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace lowrank::cuda

// Evaluates a CUDA call; returns a Status naming it from the enclosing function on failure.
#define LR_CUDA(call) LR_RETURN_IF_ERROR(::lowrank::cuda::fromCuda((call), #call))
