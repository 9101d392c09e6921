// The loader of the CUDA library, liblowrank_cuda.so: opened the first time a device buffer
// appears, so that a CPU-only program loads no CUDA library. The table between them is plain C and
// versioned (abi/cuda_backend.h); the backend of device buffers that drives it is
// engine/device_backend.h.
#pragma once
#include "abi/cuda_backend.h"
#include "util/status.h"

namespace lowrank {

// Loads liblowrank_cuda.so once per process (LOWRANK_CUDA_BACKEND names another path; default:
// the directory of liblowrank.so) and returns its table. Errors (the same at every call):
// lowrankSystemError with dlerror()'s text, or naming the path and both versions when the library
// has no table of this liblowrank's version.
Status loadCudaBackend(const lowrankCudaBackend_t** out);

}  // namespace lowrank
