// The life of a communicator's device buffers, in liblowrank: exact or compressed, the plan and
// its agreement between comm ranks, warm-up, resets on a change of count or dtype, the fresh
// initial Q (drawn on the host, the same numbers as the host engine), the counters and the view.
// The device side (memory, streams, events, kernels, NCCL calls) is the CUDA backend's,
// liblowrank_cuda.so, driven through its plain-C table (abi/cuda_backend.h). Calls are serialized
// by the communicator (lowrankComm::callMu).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "abi/cuda_backend.h"
#include "engine/engine_config.h"
#include "engine/plan.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

// What a device engine needs from its communicator.
struct DeviceCommDesc {
  void* ncclComm = nullptr;  // ncclComm_t
  int rank = 0, nranks = 1;
  EngineConfig cfg;
};

// Counters a device engine adds to lowrankGetStats.
struct DeviceCounters {
  uint64_t compressedCalls = 0, fallbackCalls = 0;  // calls are counted by the communicator
  uint64_t compressedElements = 0, exactElements = 0, payloadElements = 0;
  uint64_t stateBytes = 0, buffers = 0;
};

class DeviceEngine {
 public:
  // Loads the CUDA backend (device_backend.h) and makes the device side of desc's NCCL
  // communicator on the calling thread's current device, which the engine's calls then use
  // whatever the caller's current device is.
  static Status create(const DeviceCommDesc& desc, std::unique_ptr<DeviceEngine>* out);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // As lowrankAllReduce, arguments checked, buffers known to be device memory. layout: the one
  // given by lowrankBufferSetLayout, or null (batched view).
  Status allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                   lowrankRedOp_t op, void* stream, const Layout* layout);
  void resetBuffer(const void* recv);    // drop state; the next call plans afresh
  void releaseBuffer(const void* recv);  // drop state and free its memory
  DeviceCounters counters();
  // Fills view for a device buffer planned here; false if this engine has no such buffer.
  bool view(const void* recv, lowrankBufferView_t* view);

 private:
  struct Buffer {
    Plan plan;
    bool planned = false;
    bool exactOnly = false;  // some comm rank could not allocate: every call is exact
    uint64_t calls = 0;      // calls since the plan was made
    bool haveQ = false;      // the device state holds a Qbar (warm start)
    lowrankCudaState_t* state = nullptr;  // the backend's (null: nothing to compress, or exactOnly)
    uint64_t bytes = 0;                   // device memory the state holds
    std::vector<float> freshQ;            // a fresh initial Q (qElems floats), drawn here
  };

  DeviceEngine(const DeviceCommDesc& desc, const lowrankCudaBackend_t* backend)
      : desc_(desc), be_(backend) {}
  // A backend error as a Status (an NCCL failure with NCCL's own text).
  Status fromBackend(int code, const lowrankCudaError_t& error) const;
  Status exact(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
               lowrankRedOp_t op, void* stream);
  Status plan(Buffer& b, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
              const Layout* layout, const void* recv);
  Status allocate(Buffer& b, const Plan& pl);
  // Counts (and logs) the rejected calls among b's checks as `wait` says (lowrankCudaCollect*).
  void collectChecks(const void* recv, Buffer& b, int wait);
  void collectChecks();  // every buffer's arrived checks (never blocks)
  // Collects b's pending checks (its rejections still count), then frees its state: b plans afresh.
  void releaseState(const void* recv, Buffer& b);
  // The fresh initial Qt of every compressed tensor of b's plan, as phases::prepareQ draws it.
  const float* drawQ(Buffer& b);

  DeviceCommDesc desc_;
  const lowrankCudaBackend_t* be_;
  const lowrankRealNccl_t* nccl_ = nullptr;
  lowrankCudaComm_t* comm_ = nullptr;
  int device_ = -1;
  std::unordered_map<const void*, Buffer> buffers_;
  DeviceCounters counters_;
};

}  // namespace lowrank
