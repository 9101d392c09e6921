// Device buffers: the backend (BufferBackend, the twin of host_backend.h) whose state in device
// memory and compressed calls are held by the CUDA library, liblowrank_cuda.so (plugin/cuda_backend,
// loaded by cuda_loader.h), and driven through its plain-C table (abi/cuda_backend.h). The
// buffer's life around it (plan, agreement, warm-up, resets, the first Q, counters) is
// engine/lifecycle.h's, the same as for host buffers. Calls are serialized by the communicator
// (lowrankComm::callMu); the caller makes device() current around them (platform::DeviceGuard).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "abi/cuda_backend.h"
#include "engine/engine_config.h"
#include "engine/lifecycle.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

class DeviceBackend final : public BufferBackend {
 public:
  // Loads the CUDA library (cuda_loader.h) and makes the device side of the NCCL communicator
  // `ncclComm` (an ncclComm_t of nranks comm ranks) on that communicator's device
  // (ncclCommCuDevice: device()), which every later call then uses whatever the caller's current
  // device is (the backend makes it current around each of its entries).
  static Status create(void* ncclComm, int nranks, const EngineConfig& cfg,
                       std::unique_ptr<DeviceBackend>* out);
  ~DeviceBackend() override;  // every state made here must be gone first
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  int device() const { return device_; }

  Status exact(const Call& c) override;
  Status agree(uint64_t words[PlanCheck::kWords]) override;
  // With cfg.allocator's memory where one is set (lowrankCommSetAllocator), for c.stream's order.
  std::unique_ptr<BackendState> allocate(const Plan& plan, const Call& c, const EngineConfig& cfg,
                                         std::string* why, bool* refused) override;
  Status compressed(BackendState& state, const Plan& plan, const Call& c, const float* freshQ,
                    bool qStep, bool* fellBack) override;
  Status save(BackendState& state, const Plan& plan, float* residual, float* qt,
              float* p) override;
  Status load(BackendState& state, const Plan& plan, const float* residual, const float* qt,
              const float* p) override;
  Status collect(BackendState& state, const void* buf, int wait, uint64_t* rejected) override;
  bool broken() const override { return ncclFailed_; }
  // What the backend's NCCL calls have sent (plan checks, exact calls, factors), in NCCL's ring
  // model: lowrankStats_t.elementsSent / bytesSent of device buffers.
  void traffic(uint64_t* elements, uint64_t* bytes) const;
  // Any thread: the device waits end at once and never touch NCCL again (the engine then may
  // ncclCommAbort); later calls fail (the engine refuses them first).
  void abort();

 private:
  DeviceBackend(int nranks, const EngineConfig& cfg, const lowrankCudaBackend_t* backend)
      : nranks_(nranks), cfg_(cfg), be_(backend) {}
  // A backend error as a Status (an NCCL failure with NCCL's own text; it breaks the backend).
  Status fromBackend(int code, const lowrankCudaError_t& error);

  int nranks_;
  EngineConfig cfg_;
  const lowrankCudaBackend_t* be_;
  const lowrankRealNccl_t* nccl_ = nullptr;
  lowrankCudaComm_t* comm_ = nullptr;
  int device_ = -1;
  bool ncclFailed_ = false;  // an NCCL call of a collective failed (broken())
};

}  // namespace lowrank
