/* The real NCCL's entry points as one plain-C table, resolved once per process by liblowrank
 * (plugin/platform/nccl.cc) and lent to the NCCL shim and the CUDA backend through
 * lowrankServices_t.realNccl: one lookup of the real library per process, never interposed.
 * Types are NCCL's, passed as ints and opaque pointers (ncclDataType_t, ncclRedOp_t, ncclResult_t
 * are ints with the numbers of lowrank.h's enums; ncclComm_t, cudaStream_t, ncclSimInfo_t* are
 * pointers), so that no user of the table needs nccl.h. Optional entries are NULL when the library
 * lacks them (the NCCL version that added each is noted). Thread safety: immutable once made. */
#ifndef LOWRANK_ABI_REAL_NCCL_H_
#define LOWRANK_ABI_REAL_NCCL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclUniqueId's layout (NCCL_UNIQUE_ID_BYTES = 128 since NCCL 2.0), passed by value. */
typedef struct lowrankNcclUniqueId {
  char internal[128];
} lowrankNcclUniqueId_t;

typedef struct lowrankRealNccl {
  void* handle;     /* dlopen handle of the real library */
  const char* path; /* what was opened, for messages */
  int (*allReduce)(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                   void* stream);
  int (*groupStart)(void);
  int (*groupEnd)(void);
  int (*groupSimulateEnd)(void* simInfo); /* optional: NCCL >= 2.22 */
  int (*commCount)(const void* comm, int* count);
  int (*commUserRank)(const void* comm, int* rank);
  int (*commCuDevice)(const void* comm, int* device); /* optional */
  int (*commGetAsyncError)(void* comm, int* asyncError);
  int (*commDestroy)(void* comm);
  int (*commAbort)(void* comm);
  int (*commFinalize)(void* comm); /* optional: NCCL >= 2.14 */
  int (*redOpCreatePreMulSum)(int* op, void* scalar, int dtype, int residence,
                              void* comm);     /* optional: NCCL >= 2.11 */
  int (*redOpDestroy)(int op, void* comm);    /* optional: NCCL >= 2.11 */
  int (*getUniqueId)(lowrankNcclUniqueId_t* id);                                     /* optional */
  int (*commInitRank)(void** comm, int nranks, lowrankNcclUniqueId_t id, int rank); /* optional */
  int (*getVersion)(int* version);
  const char* (*getErrorString)(int result);
  const char* (*getLastError)(void* comm); /* optional: NCCL >= 2.13 */
} lowrankRealNccl_t;

/* What an ncclAllReduce of `count` elements over `nranks` comm ranks sends from each rank in NCCL's
 * ring model: 2 (N - 1) steps of count / N elements (busbw's factor; no overflow for any count). The
 * one statement of it, for the NCCL transport's counters and the CUDA backend's. */
static inline uint64_t lowrankNcclRingElements(uint64_t count, uint64_t nranks) {
  if (nranks < 2) return 0;
  return (count / nranks) * 2 * (nranks - 1) + (count % nranks) * 2 * (nranks - 1) / nranks;
}

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_REAL_NCCL_H_ */
