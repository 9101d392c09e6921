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

/* How a wait asks NCCL for a communicator's state: ncclCommGetAsyncError(comm, async) itself, or
 * a caller's guarded version of it (the CUDA backend polls under its abort lock). Returns an
 * ncclResult_t; *async the communicator's asynchronous error. */
typedef int (*lowrankNcclPoll_t)(void* ctx, int* async);

/* The final result of an NCCL call that returned `result`: `result` itself unless it is
 * ncclInProgress; else poll's report (or the poll's own failure) once it is no longer
 * ncclInProgress, polled for at most timeoutSec seconds; still ncclInProgress when the time ran
 * out, which the caller reports as lowrankTimeout naming the call (nccl::fromNccl). */
static inline int lowrankNcclSettlePolled(int result, double timeoutSec, lowrankNcclPoll_t poll,
                                          void* ctx) {
  struct timespec now, gap = {0, 20000}; /* 20 us between polls, as the transport's wait */
  double deadline;
  if (result != LOWRANK_NCCL_IN_PROGRESS) return result;
  clock_gettime(CLOCK_MONOTONIC, &now);
  deadline = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec + timeoutSec;
  for (;;) {
    int async = LOWRANK_NCCL_IN_PROGRESS;
    const int q = poll(ctx, &async);
    if (q != 0) return q;
    if (async != LOWRANK_NCCL_IN_PROGRESS) return async;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)now.tv_sec + 1e-9 * (double)now.tv_nsec > deadline) return LOWRANK_NCCL_IN_PROGRESS;
    nanosleep(&gap, NULL);
  }
}

struct lowrankNcclPollArgs {
  const lowrankRealNccl_t* api;
  void* comm;
};
static inline int lowrankNcclPollComm(void* ctx, int* async) {
  const struct lowrankNcclPollArgs* a = (const struct lowrankNcclPollArgs*)ctx;
  return a->api->commGetAsyncError(a->comm, async);
}

/* lowrankNcclSettlePolled with ncclCommGetAsyncError(comm) as the poll. comm NULL: the call
 * consumed its communicator (ncclCommDestroy, ncclCommAbort) or had none, so there is nothing left
 * to poll: ncclInProgress then means the call was accepted (success). */
static inline int lowrankNcclSettle(const lowrankRealNccl_t* api, void* comm, int result,
                                    double timeoutSec) {
  struct lowrankNcclPollArgs a;
  if (result == LOWRANK_NCCL_IN_PROGRESS && !comm) return 0;
  a.api = api;
  a.comm = comm;
  return lowrankNcclSettlePolled(result, timeoutSec, lowrankNcclPollComm, &a);
}

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_NCCL_SETTLE_H_ */
