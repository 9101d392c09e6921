/*
 * lowrank over an application's NCCL communicator (device buffers, CUDA streams).
 *
 * A communicator made here has the comm ranks and size of the NCCL communicator it is made from.
 * Its factor allreduces (P and Q of every compressed call, the exact part, and the small plan
 * check of a buffer's first call) are NCCL allreduces on that communicator, issued through the
 * real NCCL library's own symbols (so an LD_PRELOAD interposer of ncclAllReduce never sees them).
 * Device buffers (cudaMalloc'd) are compressed on the GPU by the CUDA backend, liblowrank_cuda.so,
 * which liblowrank loads when a device buffer first appears; host buffers take the host engine,
 * with NCCL as the transport (they must then be memory NCCL accepts).
 *
 * lowrankAllReduce on such a communicator with device buffers is asynchronous like ncclAllReduce:
 * it returns once the work is queued, and `stream` (a cudaStream_t) waits for the result. The
 * first call of a buffer blocks the host while its plan is made and checked across comm ranks.
 * CUDA graph capture of a compressible lowrankAllReduce is refused with lowrankInvalidUsage (its
 * per-buffer state changes at every call); uncompressed calls are plain ncclAllReduce calls and
 * are captured as NCCL allows.
 * Decisions that need the reduced P (non-finite or huge input on some comm rank, comm ranks
 * calling with different ops) are taken on the device, so the host never waits: such a call's
 * compressed tensors come out NaN (the exact tensors are exact sums, NaN/Inf where the inputs had
 * them), its residual is dropped and its warm-start Q kept, and it is counted in
 * lowrankStats_t.fallbackCalls once the device has got there. (The host engine instead redoes such
 * a call exactly.) AMP's inf checks see the NaN and skip the step, as with NCCL.
 *
 * The NCCL communicator stays the application's: lowrank's allreduces join its own calls on it, so
 * every comm rank must make its lowrankAllReduce and NCCL calls on that communicator in the same
 * order (as for any NCCL call), and not inside an ncclGroupStart/ncclGroupEnd of its own.
 * Asynchronous NCCL failures (a peer lost mid-collective) surface as NCCL's do: poll
 * ncclCommGetAsyncError and abort the NCCL communicator; lowrankCommAbort does not abort it.
 * Compressed dtypes are float32, float16 and bfloat16; other NCCL dtypes (float8 too) are passed
 * to ncclAllReduce unchanged.
 */
#ifndef LOWRANK_LOWRANK_NCCL_H_
#define LOWRANK_LOWRANK_NCCL_H_

#include <nccl.h>

#include "lowrank/lowrank.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes *comm over `nccl`. Not collective (no communication): every comm rank may call it at any
 * time, but all must use the same configuration (the seed in particular). `nccl` is not owned:
 * destroy *comm (lowrankCommDestroy) before the NCCL communicator.
 * Errors: lowrankInvalidArgument (null comm or nccl, bad config), lowrankInvalidUsage (a malformed
 * LOWRANK_* variable; the message names it), lowrankSystemError (the real NCCL library could not be
 * loaded or lacks a symbol: see LOWRANK_NCCL_LIBRARY; or the NCCL communicator is not usable yet,
 * e.g. a non-blocking one still initializing), and NCCL's own errors mapped to lowrank's codes.
 * *comm is null on error.
 * Thread safety: calls for different NCCL communicators may run concurrently. */
lowrankResult_t lowrankCommInitFromNccl(lowrankComm_t* comm, ncclComm_t nccl);
lowrankResult_t lowrankCommInitFromNcclConfig(lowrankComm_t* comm, ncclComm_t nccl,
                                              const lowrankConfig_t* config);

/* ---- The NCCL shim (liblowrank_nccl.so, LD_PRELOAD; or the drop-in libnccl.so.2) -------------
 * Defined by the shim, not by liblowrank: look it up in the process (dlsym(RTLD_DEFAULT, ...), or
 * ctypes.CDLL(None) from Python) when the shim is loaded. See docs/nccl_shim.md.
 *
 * Declares the tensors packed in the bucket buffer `recvbuff` (e.g. a DDP gradient bucket), so
 * that the shim compresses it per tensor (lowrankBufferSetLayout) instead of as one matrix:
 * tensor t has ndims[t] dimensions (1 to 8) whose sizes are the next ndims[t] entries of `shapes`
 * (all tensors' sizes concatenated). Kept for every communicator and applied at the buffer's next
 * compressed call (which resets its state); the same layout given again changes nothing;
 * ntensors 0 forgets the hint (the buffer's state is released); a hint whose elements do not add up
 * to the count of the buffer's call is ignored there (stale: the address holds another buffer now).
 * Give the same layout on every comm rank at the same point of the program. Local, not
 * collective; thread-safe.
 * Errors: lowrankInvalidArgument (null recvbuff; null ndims or shapes with ntensors > 0;
 * ntensors < 0; a tensor with 0 or more than 8 dimensions or a size <= 0; a total number of
 * elements that overflows), with a message at WARN that ncclGetLastError then returns. */
lowrankResult_t lowrankNcclSetBucketLayout(const void* recvbuff, int ntensors, const int* ndims,
                                           const int64_t* shapes);

#ifdef __cplusplus
}
#endif
#endif /* LOWRANK_LOWRANK_NCCL_H_ */
