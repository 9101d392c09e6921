// The entry of liblowrank_cuda.so: the table liblowrank looks up with dlsym.
#include "engine/cuda/cuda_engine.h"

extern "C" __attribute__((visibility("default")))
const lowrank::DeviceBackend lowrankCudaBackend = {lowrank::kDeviceBackendAbi,
                                                   &lowrank::cuda::CudaEngine::create};
