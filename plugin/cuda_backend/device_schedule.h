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
  // What the comm's NCCL calls sent (the table's `traffic`): NCCL's ring model of each call,
  // counted as it is issued (countSent).
  mutable std::atomic<uint64_t> elementsSent{0}, bytesSent{0};
  void countSent(size_t count, size_t elemBytes) const {
    const uint64_t e = lowrankNcclRingElements(count, uint64_t(nranks));
    elementsSent.fetch_add(e, std::memory_order_relaxed);
    bytesSent.fetch_add(e * elemBytes, std::memory_order_relaxed);
  }
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
// An alternating plan (b.plan.alternate) runs runAlternateOnDevice's step instead (qStep: which).
Err runCompressedOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                          lowrankRedOp_t op, const float* freshQ, bool qStep, cudaStream_t stream);

// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors"; device_alternate.cc), the
// twin of the host's runAlternateOnHost: one factor allreduce per call.
// P step (qStep false): Q = freshQ, else the kept Qbar orthonormalized; by row blocks, chunk by
//   chunk, alternateStepP (M = G + E into E, P = M Q, E -= P Q^T) and the P chunk's allreduce
//   (the payload, as PowerSGD's allreduce #1: the last chunk carries the checks); as each chunk
//   arrives, Pbar = P / N (kept in the payload for the next call) and out = s Pbar Q^T
//   (decompressAlternate).
// Q step: P = the kept Pbar orthonormalized (tensor by tensor, before the first Q chunk that
//   needs it); by column blocks alternateStepQ (M = G + E into E, Q = M^T P, E -= P Q^T) and the
//   Q chunk's allreduce in the wire, which holds the Q step's payload [exact part | Q | checks]
//   (the last chunk carries the checks); as each chunk arrives, Qbar = Q / N and out = s P Qbar^T;
//   then Qbar into the whole-tensor Qt (scatterQ), the next P step's Q.
// The exact part has its own allreduce, issued first, as PowerSGD's on the device. A call the
// checks reject: its output NaN (exact tensors: the exact sums), the residual zeroed, the kept Q
// left as it was; a rejected P step's P (overwritten by its allreduce) is replaced by the first k
// unit vectors (unitFactorIfRejected), so that the Q step that the engine makes next runs against
// a valid factor, the same on every comm rank.
Err runAlternateOnDevice(DeviceBuffer& b, const DeviceComm& dc, const void* send, void* recv,
                         lowrankRedOp_t op, const float* freshQ, bool qStep, cudaStream_t stream);

// Shared by both schedules (device_schedule.cc).
namespace schedule {
// The factor part of an allreduce (16-bit factors, issue 45): x[lo, hi) of the floats reduced are
// factors, which travel in `dtype` (lowrankBfloat16 or lowrankFloat16; lowrankFloat32: none) through
// the 16-bit scratch at `scratch` (hi - lo words, the buffer's wire16 at the factor's own place).
struct Factors {
  lowrankDataType_t dtype = lowrankFloat32;
  size_t lo = 0, hi = 0;
  uint16_t* scratch = nullptr;
};
// An NCCL sum allreduce of float32 in place on the communication stream, after `ready`; with a
// 16-bit factor part f: x[lo, hi) converted into f.scratch, allreduced as ncclBfloat16 /
// ncclFloat16 and converted back (on the communication stream), the floats before and after it
// (the checks) in float32 calls of their own. Each call counted (DeviceComm::countSent).
Err reduceOn(const DeviceComm& dc, float* x, size_t count, cudaEvent_t ready, cudaEvent_t reduced,
             const Factors& f = {});
// The factor part [lo, hi) (indices of the allreduced slice) of a slice whose factors start at
// `factorBase` floats into their area (P area or Q wire): the scratch at the same place.
Factors factorsOf(const DeviceBuffer& b, size_t lo, size_t hi, size_t factorBase);
// A P chunk's factor part: its floats of the payload's P area (not the checks the last one carries).
Factors pFactors(const DeviceBuffer& b, const PChunkState& ch);
// Q for this call: a fresh draw staged through the comm's pinned pool, or the last call's Qbar
// orthonormalized on the device (warm start).
Err prepareQ(DeviceBuffer& b, const DeviceComm& dc, const float* freshQ, cudaStream_t s);
// This call's [non-finite count, op] (device memory, reduced once `ready` is recorded) copied to
// the next slot of b's check ring after it; expectedOp: what the slot's op word must be.
Err queueChecks(DeviceBuffer& b, const float* checks, float expectedOp, cudaEvent_t ready,
                cudaStream_t s);
}  // namespace schedule

}  // namespace lowrank::cuda
