// The entry of liblowrank_cuda.so: the table liblowrank looks up with dlsym.
#include "engine/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>

namespace {

bool streamCapturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

}  // namespace

extern "C" __attribute__((visibility("default")))
const lowrank::DeviceBackend lowrankCudaBackend = {
    lowrank::kDeviceBackendAbi, &lowrank::cuda::CudaEngine::create, &streamCapturing};
