// The pipelined PowerSGD schedule on the device (DESIGN.md, "The pipeline"): the passes run on the
// buffer's compute stream (forked from the caller's, backend.cc), the factor allreduces on the
// communication stream, chained by events so that
// chunk c's allreduce overlaps chunk c+1's compute. Every rank issues the same NCCL calls in the
// same order; nothing here waits on the host (but a fresh initial Q's staging, rarely).
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <mutex>

#include "abi/nccl_settle.h"
#include "abi/real_nccl.h"
#include "cuda_backend/device_state.h"
#include "cuda_backend/pinned_pool.h"

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
  // Stream-ordered allocation (cudaMallocAsync, cudaFreeAsync on a buffer's stream) where the
  // device has memory pools; else synchronous, with the waits that needs (issue 39).
  bool asyncAlloc = false;
  // Pinned blocks of the buffers (check slots, a fresh Q's staging): carved from slabs, reused,
  // given back to CUDA at commDestroy only (pinned_pool.h).
  mutable PinnedPool pinned;
  // The bound of every host wait on the device (device_wait.h) and of waiting out ncclInProgress.
  double timeoutSec = 300;
  std::atomic<bool> aborted{false};       // commAbort: waits end, NCCL is not touched again
  // After an abort, the one deadline of every teardown wait (steady clock, ns; 0: not yet set),
  // whatever the number of buffers (device_wait.h, settleDevice).
  mutable std::atomic<int64_t> abortDeadlineNs{0};
  mutable std::atomic<bool> stuck{false}; // a wait timed out: teardown does not wait again
  mutable std::mutex ncclMu;              // a poll of NCCL against commAbort (the comm may go)
};

// Issues NCCL collective `what` on dc's communicator (call() makes it and returns its
// ncclResult_t) and waits out ncclInProgress (a nonblocking communicator; lowrankNcclSettlePolled,
// at most dc.timeoutSec). Refused once the comm was aborted: the check, the call and every poll
// are made under ncclMu, which commAbort takes to set the flag before ncclCommAbort frees the comm,
// so no NCCL call can slip in between (device_wait.cc). Every NCCL call of the backend goes here.
Err ncclIssue(const DeviceComm& dc, const char* what, const std::function<int()>& call);

// Queues one compressed call of a planned buffer on `stream` (its compute stream, which the caller
// has ordered after send's producer; done is recorded on it last) (G = send, output = recv). freshQ:
// the initial Qt drawn by liblowrank (qElems floats), or null for the warm start. The non-finite
// and op checks are applied on the device (see decompressAndUpdateError) and copied to the next
// free slot of b's check ring for the engine to count later (the caller frees one first).
Err runCompressedOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                          lowrankRedOp_t op, const float* freshQ, cudaStream_t stream);

}  // namespace lowrank::cuda
