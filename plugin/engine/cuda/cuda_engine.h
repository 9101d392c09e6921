// The device side of one communicator (DeviceEngine): per-buffer device state keyed by recvbuff,
// the communication stream, the choice between exact (NCCL as is) and compressed calls, and the
// plan-time agreement between comm ranks. Calls are serialized by the communicator.
#pragma once
#include <cuda_runtime_api.h>

#include <unordered_map>

#include "engine/cuda/device_schedule.h"
#include "engine/cuda/device_state.h"
#include "engine/device_backend.h"

namespace lowrank::cuda {

class CudaEngine : public DeviceEngine {
 public:
  static Status create(const DeviceCommDesc& desc, std::unique_ptr<DeviceEngine>* out);
  ~CudaEngine() override;

  Status allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                   lowrankRedOp_t op, void* stream, const Layout* layout) override;
  void resetBuffer(const void* recv) override;
  void releaseBuffer(const void* recv) override;
  DeviceCounters counters() override;
  bool view(const void* recv, lowrankBufferView_t* view) override;

 private:
  explicit CudaEngine(const DeviceCommDesc& desc) : desc_(desc) {}
  Status exact(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
               lowrankRedOp_t op, cudaStream_t s);
  Status plan(DeviceBuffer& b, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
              const Layout* layout, const void* recv);
  // Counts the rejected calls among b's checks that have arrived, oldest first; waits for the
  // oldest `wait` of them (0: never blocks; SIZE_MAX: all).
  void collectChecks(const void* recv, DeviceBuffer& b, size_t wait);
  void collectChecks();  // every buffer's arrived checks (never blocks)
  // Collects b's pending checks (its rejections still count), then frees its state.
  void releaseState(const void* recv, DeviceBuffer& b);

  DeviceCommDesc desc_;
  DeviceComm comm_;
  int device_ = 0;
  std::unordered_map<const void*, DeviceBuffer> buffers_;
  DeviceCounters counters_;
  uint64_t* planCheck_ = nullptr;  // device: the plan agreement's three words
};

}  // namespace lowrank::cuda
