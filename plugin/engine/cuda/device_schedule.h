// The pipelined PowerSGD schedule on the device (DESIGN.md, "The pipeline"): the passes run on the
// buffer's compute stream (forked from the caller's, backend.cc), the factor allreduces on the
// communication stream, chained by events so that
// chunk c's allreduce overlaps chunk c+1's compute. Every rank issues the same NCCL calls in the
// same order; nothing here waits on the host (but a fresh initial Q's staging, rarely).
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

#include "abi/nccl_settle.h"
#include "abi/real_nccl.h"
#include "engine/cuda/device_state.h"

namespace lowrank::cuda {

// One communicator's device side (the table's lowrankCudaComm_t).
struct DeviceComm {
  const lowrankRealNccl_t* api = nullptr;
  void* comm = nullptr;            // ncclComm_t
  cudaStream_t stream = nullptr;   // communication stream
  int nranks = 1;
  int device = 0;
  uint64_t* planCheck = nullptr;   // device: the plan agreement's three words
  uint64_t* hostPlanCheck = nullptr;  // pinned: their staging
  // The bound of every host wait on the device (device_wait.h) and of waiting out ncclInProgress.
  double timeoutSec = 300;
  std::atomic<bool> aborted{false};       // commAbort: waits end, NCCL is not touched again
  mutable std::atomic<bool> stuck{false}; // a wait timed out: teardown does not wait again
  mutable std::mutex ncclMu;              // a poll of NCCL against commAbort (the comm may go)
};

// The Err of NCCL call `what` on dc's communicator that returned r, once it is done: ncclInProgress
// (a nonblocking communicator) waited out by lowrankNcclSettle, at most dc.timeoutSec. Every NCCL
// call of the backend goes through it.
inline Err ncclCall(const DeviceComm& dc, int r, const char* what) {
  return fromNccl(lowrankNcclSettle(dc.api, dc.comm, r, dc.timeoutSec), what);
}

// Queues one compressed call of a planned buffer on `stream` (its compute stream, which the caller
// has ordered after send's producer; done is recorded on it last) (G = send, output = recv). freshQ:
// the initial Qt drawn by liblowrank (qElems floats), or null for the warm start. The non-finite
// and op checks are applied on the device (see decompressAndUpdateError) and copied to the next
// free slot of b's check ring for the engine to count later (the caller frees one first).
Err runCompressedOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                          lowrankRedOp_t op, const float* freshQ, cudaStream_t stream);

}  // namespace lowrank::cuda
