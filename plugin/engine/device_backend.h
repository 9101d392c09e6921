// The boundary between liblowrank (host C++, no CUDA library linked) and the CUDA backend,
// liblowrank_cuda.so, which it loads the first time a device buffer appears. Both sides are built
// from the same tree; kDeviceBackendAbi guards against a stale backend next to a newer library.
#pragma once
#include <cstddef>
#include <memory>

#include "engine/engine_config.h"
#include "engine/plan.h"
#include "lowrank/lowrank.h"
#include "platform/nccl.h"
#include "util/status.h"

namespace lowrank {

constexpr int kDeviceBackendAbi = 2;

// What a device engine needs from its communicator.
struct DeviceCommDesc {
  const nccl::Api* nccl = nullptr;  // the real NCCL; null: the communicator has no NCCL
  void* ncclComm = nullptr;
  int rank = 0, nranks = 1;
  EngineConfig cfg;
};

// Counters a device engine adds to lowrankGetStats.
struct DeviceCounters {
  uint64_t compressedCalls = 0, fallbackCalls = 0;  // calls are counted by the communicator
  uint64_t compressedElements = 0, exactElements = 0, payloadElements = 0;
  uint64_t stateBytes = 0, buffers = 0;
};

// The device side of one communicator: per-buffer state in device memory, its own streams.
// Calls are serialized by the communicator (lowrankComm::callMu).
class DeviceEngine {
 public:
  virtual ~DeviceEngine() = default;
  // As lowrankAllReduce, arguments checked, buffers known to be device memory. layout: the one
  // given by lowrankBufferSetLayout, or null (batched view).
  virtual Status allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                           lowrankRedOp_t op, void* stream, const Layout* layout) = 0;
  virtual void resetBuffer(const void* recv) = 0;    // drop state; the next call plans afresh
  virtual void releaseBuffer(const void* recv) = 0;  // drop state and free its memory
  virtual DeviceCounters counters() = 0;
  // Fills view for a device buffer planned here; false if this engine has no such buffer.
  virtual bool view(const void* recv, lowrankBufferView_t* view) = 0;
};

// The table liblowrank_cuda.so exports as `lowrankCudaBackend` (extern "C").
struct DeviceBackend {
  int abi = kDeviceBackendAbi;
  Status (*createEngine)(const DeviceCommDesc& desc, std::unique_ptr<DeviceEngine>* out) = nullptr;
  // True if `stream` (a cudaStream_t) is being captured into a CUDA graph. Makes no other CUDA
  // call, so it is safe during capture, before any engine exists.
  bool (*streamCapturing)(void* stream) = nullptr;
};

// Loads liblowrank_cuda.so once (LOWRANK_CUDA_BACKEND names another path; default: the directory
// of liblowrank.so). Errors: lowrankSystemError with dlerror()'s text, or an ABI mismatch.
Status deviceBackend(const DeviceBackend** out);

}  // namespace lowrank
