/* The table between liblowrank and its CUDA backend, liblowrank_cuda.so, which liblowrank loads
 * with dlopen the first time a device buffer appears (plugin/engine/cuda_loader.cc), so that a
 * CPU-only program loads no CUDA library. Plain C and versioned, as NCCL's plugin tables: the
 * backend exports `lowrankCudaBackendV9`; liblowrank refuses a table whose `version` is not the
 * one it was built with (naming the path and both versions).
 *
 * Who does what. liblowrank keeps a device buffer's life (plugin/engine/device_backend.h): exact or
 * compressed, the plan and its cross-rank check, warm-up, resets, counters, the view, and the fresh
 * initial Q (drawn on the host, the same numbers as the host engine). The backend holds the device
 * side only: per communicator a CUDA stream for the collectives and a small device buffer for the
 * plan check; per buffer the device memory of a plan (residual, factors, launch tables, events, a
 * ring of pending non-finite/op checks); and it queues one compressed call on the caller's stream.
 * It logs through liblowrank (lowrankGetServices, plugin/abi/services.h): one logging state per
 * process.
 *
 * Errors: every fallible entry returns a lowrankResult_t (0: success) and fills *error (never NULL):
 * `message` names what failed; `ncclResult` is the ncclResult_t of the NCCL call that failed, 0 when
 * the failure was not NCCL's (liblowrank then adds NCCL's own text of it). No exception crosses.
 * Device: the comm's device is its NCCL communicator's (ncclCommCuDevice; the calling thread's
 * current device only where NCCL lacks that entry), taken by `commCreate` before anything is made;
 * every entry makes it current for its own duration and restores the caller's device after, so a
 * caller may call from a thread with any device current. Calls on one comm and its states are serialized by the caller,
 * except commAbort (any thread, any time).
 * Waits: every host wait on the device is bounded by commCreate's timeoutSec and polls NCCL's
 * asynchronous error meanwhile (cuda_backend/device_wait.h); its failure is an error naming the
 * phase ("waiting for the plan check: timed out after 30 s (LOWRANK_TIMEOUT)"). */
#ifndef LOWRANK_ABI_CUDA_BACKEND_H_
#define LOWRANK_ABI_CUDA_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include "abi/real_nccl.h"
#include "lowrank/lowrank.h" /* lowrankAllocFn_t, lowrankFreeFn_t: C, no CUDA */

#ifdef __cplusplus
extern "C" {
#endif

#define LOWRANK_CUDA_BACKEND_VERSION 9 /* 7: stateCreate takes an allocator and the call's stream,
                                          and reports its memory by kind; 8: alternating PowerSGD
                                          (issue 44): lowrankCudaPlan_t.alternate (the wire then
                                          holds a Q step's payload), runCompressed's qStep,
                                          stateSave / stateLoad's p (the kept P); 9: 16-bit
                                          factors (issue 45): lowrankCudaPlan_t.factorDtype,
                                          and `traffic` (the bytes the backend's NCCL calls
                                          sent, for lowrankStats_t) */

/* The payload of allreduce #1, host and device alike: [exact part (exactElems floats) | P of every
 * compressed tensor (pElems) | non-finite count | op code]. The last two let every comm rank take
 * the same decision: reject the call (non-finite or huge input on some rank) or refuse it (the
 * ranks disagree on sum vs avg). The one definition of its layout and of the op code, for
 * liblowrank's Plan (engine/plan.h) and host schedule and for the device's schedule. */
typedef struct lowrankPayloadLayout {
  uint64_t p, flag, op; /* where P, the non-finite count and the op code sit */
  uint64_t elems;       /* its length */
} lowrankPayloadLayout_t;
static inline lowrankPayloadLayout_t lowrankPayload(uint64_t exactElems, uint64_t pElems) {
  lowrankPayloadLayout_t l = {exactElems, exactElems + pElems, exactElems + pElems + 1,
                              exactElems + pElems + 2};
  return l;
}
/* The op code (lowrankSum 0 -> 1, lowrankAvg 4 -> 2): summed over N comm ranks it is N times one
 * code only if every rank used the same op. */
static inline float lowrankPayloadOpCode(int op) { return op == 0 ? 1.f : 2.f; }
/* Words of the plan agreement (liblowrank's PlanCheck, engine/plan.h), max-allreduced as uint64. */
#define LOWRANK_PLAN_CHECK_WORDS 5
#define LOWRANK_CUDA_BACKEND_SYMBOL "lowrankCudaBackendV9"
/* A NUL-terminated line, what the backend was built for, read by `python -m lowrank` without
 * initializing CUDA: "cuda=13000 arch=sm_80,sm_90,compute_90 cudart=static" (cuda: CUDART_VERSION, 1000 * major +
 * 10 * minor; 0 for the CPU emulation). */
#define LOWRANK_CUDA_BUILD_INFO_SYMBOL "lowrankCudaBuildInfo"

typedef struct lowrankCudaError {
  int ncclResult;     /* the failed NCCL call's ncclResult_t; 0: not an NCCL failure */
  int refused;        /* 1: the supplied allocator (lowrankCudaAllocator_t) refused memory */
  char message[512];  /* what failed, NUL-terminated */
} lowrankCudaError_t;

/* A compressed buffer's plan as the device needs it (liblowrank's Plan, engine/plan.h, flattened).
 * Element offsets count elements of the buffer (dtype), or floats of the factor buffers:
 * payload = [exact part (exactElems) | P (pElems) | non-finite count | op], Qt (qElems, whole-tensor
 * layout), and the wire (qElems: Qt by column blocks, as the Q chunks travel; alternating, a Q
 * step's payload, lowrankPayload(exactElems, qElems): [exact part | Qt by column blocks | checks]). */
typedef struct lowrankCudaTensor {
  uint64_t offset, numel;  /* in the buffer */
  uint64_t rows, cols;     /* compressed: the matrix view (n x m) */
  uint64_t ld;             /* its row stride (>= cols) */
  uint64_t valid;          /* elements of the view that exist (fewer than rows * cols if padded) */
  uint64_t pOffset;        /* compressed: P (rows x k) at payload[exactElems + pOffset] */
  uint64_t qOffset;        /* compressed: Qt (k x cols) at qt[qOffset] */
  uint64_t exactOffset;    /* exact: at payload[exactOffset .. + numel) */
  uint64_t lastPChunk;     /* the P chunk that completes this tensor's P */
  float limit;             /* pass 1: |M| >= limit counts as non-finite (overflow bound) */
  int32_t k;               /* approximation rank */
  int32_t compressed;      /* 0: allreduced exactly, in the payload's exact part */
  int32_t pad_;
} lowrankCudaTensor_t;

/* A block of a chunk, resolved by liblowrank (engine/plan.h: rowSpan, colSpan; the one place block
 * offsets are computed, for the host schedule and this one). Row blocks (P chunks): rows [first,
 * first + rows) of the tensor's view; P rows at p (stride k) in the P area, the tensor's Qt at qt
 * (stride qld = cols). Column blocks (Q chunks): columns [first, first + cols); the tensor's P at
 * p, the block's Qt at wire[qt] (stride qld = cols). */
typedef struct lowrankCudaBlock {
  uint64_t tensor, first;
  uint64_t offset;  /* element (0, 0) of the block in the buffer */
  uint64_t valid;   /* elements that exist counted from offset */
  uint64_t ld;      /* row stride of the tensor's view */
  uint64_t rows, cols;
  uint64_t p, qt, qld;
  int32_t k, pad_;
} lowrankCudaBlock_t;
/* Blocks [first, last) of the row (P chunks) or column (Q chunks) blocks; the floats allreduced
 * together: payload[offset .. + count) (P chunks) or wire[offset .. + count) (Q chunks). */
typedef struct lowrankCudaChunk { uint64_t first, last, offset, count; } lowrankCudaChunk_t;

typedef struct lowrankCudaPlan {
  uint64_t count;          /* elements of the buffer */
  int32_t dtype;           /* lowrankDataType_t: float32, float16 or bfloat16 */
  int32_t errorFeedback;   /* 1: keep a residual (count floats) */
  double orthoEpsilon;     /* warm start: the Gram-Schmidt epsilon of the device orthonormalization */
  uint64_t exactElems, pElems, qElems;
  const lowrankCudaTensor_t* tensors;     uint64_t nTensors;
  const lowrankCudaBlock_t* rowBlocks;    uint64_t nRowBlocks;
  const lowrankCudaBlock_t* colBlocks;    uint64_t nColBlocks;
  const lowrankCudaChunk_t* pChunks;      uint64_t nPChunks;  /* >= 1; the last carries the checks */
  const lowrankCudaChunk_t* qChunks;      uint64_t nQChunks;  /* >= 1 */
  int32_t alternate;       /* 1: alternating PowerSGD (ACP-SGD; runCompressed's qStep) */
  /* lowrankDataType_t the factors travel in (issue 45): lowrankFloat32, or lowrankBfloat16 /
   * lowrankFloat16: every factor allreduce then converts the factor part of its floats (P of a
   * P chunk, Qt of a Q chunk) into a 16-bit scratch, allreduces it as ncclBfloat16 / ncclFloat16
   * and converts it back; the exact part and the two check words stay float32, in calls of their
   * own. Alternating, each step's own factor is rounded to it before its residual is taken.
   * (liblowrank passes bfloat16 for a float16 request: docs/design.md, "16-bit factors".) */
  int32_t factorDtype;
} lowrankCudaPlan_t;

/* Device memory from the application (lowrankCommSetAllocator): both functions null for CUDA's own
 * (cudaMallocAsync where the device has memory pools, else cudaMalloc). */
typedef struct lowrankCudaAllocator {
  lowrankAllocFn_t alloc;
  lowrankFreeFn_t free;
  void* userdata;
} lowrankCudaAllocator_t;

/* The bytes a state holds, by kind (lowrankMemoryInfo_t's fields of the same names). A plan with
 * 16-bit factors holds a scratch of 2 bytes per factor element of its largest phase (the 16-bit
 * copy of the factors on the wire), counted in `workspace`. */
typedef struct lowrankCudaMemory {
  uint64_t residual, factors, payload, workspace, tables, pinned;
} lowrankCudaMemory_t;

typedef struct lowrankCudaComm lowrankCudaComm_t;   /* one communicator's device side */
typedef struct lowrankCudaState lowrankCudaState_t; /* one planned buffer's device memory */

/* How much of a state's check ring collectChecks waits for. */
enum {
  lowrankCudaCollectArrived = 0, /* only the checks that have arrived: never blocks */
  lowrankCudaCollectForRoom = 1, /* as Arrived, but when every slot is pending waits for the oldest,
                                  * so that the next call has a slot */
  lowrankCudaCollectAll = 2      /* waits for every pending check */
};

typedef struct lowrankCudaBackend {
  uint32_t version; /* LOWRANK_CUDA_BACKEND_VERSION of the backend's build */
  uint32_t size;    /* sizeof(lowrankCudaBackend_t) there */

  /* The device side of an NCCL communicator of `nranks` comm ranks, on the communicator's device
   * (ncclCommCuDevice, returned in *device; see "Device" above). `nccl`: the real NCCL, lent by liblowrank for the comm's life.
   * timeoutSec: the communicator's (lowrankConfig_t.timeoutSec): the bound of every wait on the
   * device, and of waiting out an NCCL call that returned ncclInProgress (abi/nccl_settle.h). */
  int (*commCreate)(const lowrankRealNccl_t* nccl, void* ncclComm, int nranks, double timeoutSec,
                    lowrankCudaComm_t** comm, int* device, lowrankCudaError_t* error);
  /* Waits for the comm's stream (bounded) and frees it; a stream that does not finish is left
   * (not destroyed). Every state made on it is destroyed first. */
  void (*commDestroy)(lowrankCudaComm_t* comm);
  /* Any thread, any time: a wait in progress returns an error at once, later waits of calls fail
   * at once, and NCCL is never touched again by the backend's waits (the caller may then
   * ncclCommAbort the communicator). Teardown after it waits at most a second per state (what
   * does not finish is left allocated). */
  void (*commAbort)(lowrankCudaComm_t* comm);

  /* The plan agreement: words[0..LOWRANK_PLAN_CHECK_WORDS) max-allreduced in place over the comm
   * (on its stream; the host waits for the result). */
  int (*planCheck)(lowrankCudaComm_t* comm, uint64_t* words, lowrankCudaError_t* error);

  /* ncclAllReduce as is (send/recv device memory, `stream` a cudaStream_t). */
  int (*exactAllReduce)(lowrankCudaComm_t* comm, const void* send, void* recv, size_t count,
                        int dtype, int op, void* stream, lowrankCudaError_t* error);

  /* Allocates and initializes (zero residual and factors) the device state of `plan` (copied: the
   * description may go after the call). allocator: where its device memory comes from (copied;
   * the state gives it back there); stream: the planning call's cudaStream_t, which the
   * allocator is given and which the state's work is ordered after. *memory: the bytes it holds.
   * On failure nothing stays allocated; error->refused says the allocator refused. */
  int (*stateCreate)(lowrankCudaComm_t* comm, const lowrankCudaPlan_t* plan,
                     const lowrankCudaAllocator_t* allocator, void* stream,
                     lowrankCudaState_t** state, lowrankCudaMemory_t* memory,
                     lowrankCudaError_t* error);
  /* Waits for the state's last call (bounded), then frees it; checks still pending are dropped
   * (collect them first to count them). A state whose last call does not finish is left
   * allocated (a WARN says so): freeing memory a kernel may still use would be worse. */
  void (*stateDestroy)(lowrankCudaState_t* state);

  /* Queues one compressed call (send = G, recv = output, op lowrankSum or lowrankAvg) on `stream`,
   * after the state's previous call on whatever stream. freshQ: the initial Qt of every compressed
   * tensor (qElems floats, orthonormalized, read before the call returns), or NULL for the warm
   * start (the last call's Qbar, orthonormalized on the device). qStep (an alternating plan only,
   * else 0): 1 for a Q step against the kept P (freshQ is then NULL), 0 for a P step against the
   * kept (or fresh) Q. The call's checks go to the next slot of the state's ring: the caller
   * collects with lowrankCudaCollectForRoom first. On failure the state must be destroyed (it may
   * be half updated). */
  int (*runCompressed)(lowrankCudaComm_t* comm, lowrankCudaState_t* state, const void* send,
                       void* recv, int op, const float* freshQ, int qStep, void* stream,
                       lowrankCudaError_t* error);

  /* Checkpoint (lowrankBufferSaveState / RestoreState): copies the state's residual (the plan's
   * count floats; skipped when error feedback is off or `residual` is NULL), Qt (qElems floats,
   * whole-tensor layout) and, `p` not NULL, the P area of the payload (pElems floats: an
   * alternating plan's kept P before a Q step) to host memory, or from it. Both wait for the
   * state's last call first and copy synchronously (on no stream of the caller's), so the host
   * memory may go when they return. A failed load leaves the state to be destroyed (it may be
   * half written). */
  int (*stateSave)(lowrankCudaState_t* state, float* residual, float* qt, float* p,
                   lowrankCudaError_t* error);
  int (*stateLoad)(lowrankCudaState_t* state, const float* residual, const float* qt,
                   const float* p, lowrankCudaError_t* error);

  /* Collects the state's pending checks, oldest first, as `wait` says (lowrankCudaCollect*):
   * *rejected: how many of the collected calls were rejected on the device (output NaN), of which
   * *opMismatches because the comm ranks used different ops (the rest: non-finite or huge input).
   * A device failure drops the pending checks (their calls report it). Errors: a wait that failed
   * (timeout, NCCL's asynchronous error, abort); what was collected before it is counted. */
  int (*collectChecks)(lowrankCudaState_t* state, int wait, uint32_t* rejected,
                       uint32_t* opMismatches, lowrankCudaError_t* error);

  /* What the comm's NCCL calls have sent since commCreate, counted as each call is issued, in
   * NCCL's ring model (lowrankNcclRingElements: 2 (N - 1) / N of each call's elements) times each
   * call's element size: the plan checks, exact calls and every factor allreduce (a 16-bit factor
   * element 2 bytes). For lowrankStats_t.elementsSent / bytesSent. Any thread. */
  void (*traffic)(lowrankCudaComm_t* comm, uint64_t* elements, uint64_t* bytes);
} lowrankCudaBackend_t;

/* The table of a liblowrank_cuda.so: its one exported symbol (LOWRANK_CUDA_BACKEND_SYMBOL), looked
 * up with dlsym. */
extern const lowrankCudaBackend_t lowrankCudaBackendV9;

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_CUDA_BACKEND_H_ */
