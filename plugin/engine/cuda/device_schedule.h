// The pipelined PowerSGD schedule on the device (DESIGN.md, "The pipeline"): the passes run on the
// caller's stream, the factor allreduces on the communication stream, chained by events so that
// chunk c's allreduce overlaps chunk c+1's compute. Every rank issues the same NCCL calls in the
// same order; nothing here waits on the host.
#pragma once
#include <cuda_runtime_api.h>

#include "engine/cuda/device_state.h"
#include "engine/engine_config.h"
#include "platform/nccl.h"

namespace lowrank::cuda {

struct DeviceComm {
  const nccl::Api* api = nullptr;
  void* comm = nullptr;            // ncclComm_t
  cudaStream_t stream = nullptr;   // communication stream
  int nranks = 1;
};

// Queues one compressed call of a planned buffer on `stream` (G = send, output = recv). The
// non-finite and op checks are applied on the device (see decompressAndUpdateError) and copied to
// the next free slot of b's check ring for the engine to count later (the caller frees one first).
Status runCompressedOnDevice(DeviceBuffer& b, const EngineConfig& cfg, const DeviceComm& dc,
                             const void* send, void* recv, lowrankRedOp_t op, cudaStream_t stream);

}  // namespace lowrank::cuda
