/* Waiting out ncclInProgress: the one rule, for every NCCL call lowrank makes (liblowrank's NCCL
 * transport and the communicators it makes and releases, through nccl::settle in
 * plugin/platform/nccl.h; the CUDA backend's calls, through its ncclCall). Header-only and plain C
 * so that both libraries use this one definition (the CUDA backend compiles no source of
 * liblowrank's).
 *
 * Why: on a nonblocking communicator (ncclConfig_t.blocking = 0, NCCL_COMM_BLOCKING=0, PyTorch's
 * TORCH_NCCL_USE_COMM_NONBLOCKING=1) any call on it may return ncclInProgress (7): the call was
 * accepted and NCCL finishes it in the background; it is done once ncclCommGetAsyncError(comm) no
 * longer reports ncclInProgress, and its result is what that reports then. */
#ifndef LOWRANK_ABI_NCCL_SETTLE_H_
#define LOWRANK_ABI_NCCL_SETTLE_H_

#include <time.h>

#include "abi/real_nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWRANK_NCCL_IN_PROGRESS 7 /* ncclInProgress */

/* The final result of an NCCL call on `comm` that returned `result`: `result` itself unless it is
 * ncclInProgress; else ncclCommGetAsyncError(comm)'s report (or that call's own failure) once it
 * is no longer ncclInProgress, polled for at most timeoutSec seconds; still ncclInProgress when the
 * time ran out, which the caller reports as lowrankTimeout naming the call (nccl::fromNccl).
 * comm NULL: the call consumed its communicator (ncclCommDestroy, ncclCommAbort) or had none, so
 * there is nothing left to poll: ncclInProgress then means the call was accepted (success). */
static inline int lowrankNcclSettle(const lowrankRealNccl_t* api, void* comm, int result,
                                    double timeoutSec) {
  struct timespec now, gap = {0, 20000}; /* 20 us between polls, as the transport's wait */
  double deadline;
  if (result != LOWRANK_NCCL_IN_PROGRESS) return result;
  if (!comm) return 0;
  clock_gettime(CLOCK_MONOTONIC, &now);
  deadline = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec + timeoutSec;
  for (;;) {
    int async = LOWRANK_NCCL_IN_PROGRESS;
    const int q = api->commGetAsyncError(comm, &async);
    if (q != 0) return q;
    if (async != LOWRANK_NCCL_IN_PROGRESS) return async;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)now.tv_sec + 1e-9 * (double)now.tv_nsec > deadline) return LOWRANK_NCCL_IN_PROGRESS;
    nanosleep(&gap, NULL);
  }
}

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_NCCL_SETTLE_H_ */
