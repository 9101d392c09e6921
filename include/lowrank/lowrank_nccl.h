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
 * order (as for any NCCL call). A compressed lowrankAllReduce must not be made inside the
 * caller's ncclGroupStart/ncclGroupEnd (on any communicator): NCCL defers lowrank's collectives to
 * ncclGroupEnd while the events that order its passes record at once, so the output would be
 * computed from unreduced factors. NCCL offers no query of an open group, so lowrank cannot refuse
 * it in general: a buffer's first call (which waits for its plan check, held by NCCL until
 * ncclGroupEnd) fails with lowrankTimeout at LOWRANK_TIMEOUT saying so; later calls are not
 * detected. (The NCCL shim, LD_PRELOAD=liblowrank_nccl.so, sees the group and defers such a
 * call to ncclGroupEnd.) Uncompressed calls are ncclAllReduce and may be grouped as NCCL allows.
 * Asynchronous NCCL failures (a peer lost mid-collective) surface as NCCL's do: poll
 * ncclCommGetAsyncError and abort the NCCL communicator; lowrankCommAbort does not abort it. Every
 * wait of lowrank on the device (the plan check, a checkpoint, room for a call's checks) polls
 * ncclCommGetAsyncError too and is bounded by LOWRANK_TIMEOUT: an NCCL error or the timeout there
 * fails the lowrank communicator, its message naming the buffer and the phase ("waiting for the
 * plan check: timed out after 30 s").
 * An NCCL error in the middle of a compressed call fails the lowrank communicator: any error NCCL
 * returns for one of lowrank's allreduces, of host or device buffers (ncclInvalidUsage and
 * ncclInvalidArgument included, as well as an asynchronous error, a failed stream query or
 * LOWRANK_TIMEOUT while waiting for it) is that call's result, mapped to lowrank's code, and every
 * later call on the communicator is refused with lowrankInvalidUsage naming it ("... failed
 * earlier ...") until it is destroyed: the other comm ranks may have entered that allreduce, so
 * the ranks can no longer be assumed in step. (Before, ncclInvalidUsage and ncclInvalidArgument
 * left the communicator usable.) The NCCL communicator itself is the application's to recover.
 * (lowrankCommInitNcclRank instead makes an NCCL communicator that lowrank owns: there,
 * lowrankCommDestroy destroys it, and lowrankCommAbort, or any failure of the lowrank communicator
 * (a timeout, an NCCL error, a peer lost), aborts it at once with ncclCommAbort, so that the
 * caller's stream, joined behind its collectives, is released.)
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
 * destroy *comm (lowrankCommDestroy) before the NCCL communicator. Device buffers go to the NCCL
 * communicator's device (ncclCommCuDevice), whatever device is current when a call is made.
 * Errors: lowrankInvalidArgument (null comm or nccl, bad config), lowrankInvalidUsage (a malformed
 * LOWRANK_* variable; the message names it), lowrankSystemError (the real NCCL library could not be
 * loaded or lacks a symbol: see LOWRANK_NCCL_LIBRARY; or the NCCL communicator is not usable yet,
 * e.g. a non-blocking one still initializing), and NCCL's own errors mapped to lowrank's codes.
 * *comm is null on error.
 * Thread safety: calls for different NCCL communicators may run concurrently. */
lowrankResult_t lowrankCommInitFromNccl(lowrankComm_t* comm, ncclComm_t nccl);
lowrankResult_t lowrankCommInitFromNcclConfig(lowrankComm_t* comm, ncclComm_t nccl,
                                              const lowrankConfig_t* config);

/* ---- An NCCL communicator made and owned by lowrank ------------------------------------------
 * For callers that cannot reach an ncclComm_t of their own (the Python package over PyTorch):
 * lowrank makes the NCCL communicator with the real NCCL library (the one its NCCL transport uses:
 * LOWRANK_NCCL_LIBRARY, else libnccl.so.2), so the caller need not load NCCL itself. The
 * communicator then behaves as one from lowrankCommInitFromNccl, except that it is lowrank's: no
 * other NCCL call may be made on it (there is no way to reach it), and it ends with *comm.
 *
 * Writes in *id a new NCCL unique id (ncclGetUniqueId of the real library). Make it on one comm
 * rank and pass it to the others (e.g. over a store), as with ncclGetUniqueId.
 * Errors: lowrankInvalidArgument (null id), lowrankSystemError (the real NCCL library could not be
 * loaded or lacks a symbol, ncclGetUniqueId included: the message names the library and the
 * symbol), and NCCL's own errors mapped to lowrank's codes.
 * Thread safety: may be called from any thread. */
lowrankResult_t lowrankNcclGetUniqueId(ncclUniqueId* id);

/* Makes a new NCCL communicator (ncclCommInitRank of the real library, on the calling thread's
 * current CUDA device: select it with cudaSetDevice first) and *comm over it, with `config` (may be
 * NULL: LOWRANK_* variables, then defaults), as lowrankCommInitFromNcclConfig. Collective, as
 * ncclCommInitRank: all `nranks` comm ranks call it with the same `id` (lowrankNcclGetUniqueId)
 * and each its own `rank`, and the call blocks until they all have; every comm rank must use the
 * same configuration.
 * *comm OWNS the NCCL communicator: lowrankCommDestroy destroys it (ncclCommDestroy) after
 * lowrank's own state is freed, and lowrankCommAbort aborts it (ncclCommAbort) before, so that
 * the abort ends a call blocked on one of its collectives;
 * an error of that NCCL call is the result of lowrankCommDestroy / lowrankCommAbort (*comm is
 * freed all the same).
 * Errors: lowrankInvalidArgument (null comm, nranks < 1, rank not in [0, nranks), bad config),
 * lowrankInvalidUsage (a malformed LOWRANK_* variable; the message names it), lowrankSystemError
 * (the real NCCL library could not be loaded or lacks a symbol, ncclCommInitRank included: the
 * message names the library and the symbol), and NCCL's own errors mapped to lowrank's codes.
 * Argument and configuration errors are found before any communication. *comm is null on error,
 * and no NCCL communicator is left behind (one already made is destroyed).
 * Thread safety: as ncclCommInitRank: one thread per comm rank; inits of different communicators
 * may run concurrently. */
lowrankResult_t lowrankCommInitNcclRank(lowrankComm_t* comm, int nranks, ncclUniqueId id, int rank,
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
