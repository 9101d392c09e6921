// The test-only entry points of the NCCL test double (libnccl.so.2 in this directory), beside
// NCCL's own API. Tests use it to see which entry points were really called, e.g. that lowrank's
// NCCL transport goes through pncclAllReduce and never the interposable ncclAllReduce.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Calls made in this process to the exported entry point `entry` ("ncclAllReduce",
// "pncclAllReduce", "ncclGroupStart", ...): the plain and p-prefixed names count apart. 0 for a
// name the double does not export or never saw called.
unsigned long long ncclDoubleCallCount(const char* entry);

// NCCL communicators made in this process (ncclCommInitRank, ncclCommInitAll) and not yet
// destroyed or aborted: tests see whether a communicator someone else owns was let go.
int ncclDoubleLiveComms(void);

// Makes the next call in this process to the exported entry point `entry` (as in
// ncclDoubleCallCount: "pncclCommCount" and "ncclCommCount" apart) return `result` at once,
// doing nothing else: tests reach error paths that follow a successful NCCL call. Only for entry
// points returning ncclResult_t; result 0 (ncclSuccess) cancels a pending injection.
void ncclDoubleFailNext(const char* entry, int result);

// Makes the `nth` collective call on `comm` from now on (1: the next; every collective entry
// point counts, ncclAllReduce and pncclAllReduce alike) return `result` at once, doing nothing
// else, as NCCL does when it refuses a call. Per communicator: comm ranks that are threads of one
// process each arm their own, so that all of them fail the same call and none waits for a peer
// that never joins. result 0 (ncclSuccess) or nth 0 cancels a pending injection. comm must be a
// live communicator of the double (ignored if NULL). The call is counted by ncclDoubleCallCount.
struct ncclComm;  /* ncclComm_t */
void ncclDoubleFailCollective(struct ncclComm* comm, unsigned long long nth, int result);

/* A dead peer, for the tests of bounded waits (the build for the CUDA emulation only; elsewhere
 * nothing changes): while `on`, every collective queued on a stream never completes, as NCCL's
 * kernels spin for a peer that is gone, until its communicator is aborted (ncclCommAbort, which
 * ends them: they then do nothing) or the stall is lifted (on = 0: they run normally). */
void ncclDoubleStallCollectives(int on);

#ifdef __cplusplus
}
#endif
