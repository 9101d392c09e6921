// Internals of the NCCL test double: a host-memory NCCL for tests only, never installed.
//
// An ncclComm here is a lowrank communicator (lowrank's public C API, UCX underneath) made with
// approxRank = 0 set explicitly in its config, so that every call is an exact allreduce whatever
// LOWRANK_APPROX_RANK says; ncclUniqueId carries a lowrankUniqueId (both 128 bytes). Other
// LOWRANK_* variables (LOWRANK_TIMEOUT, LOWRANK_DEBUG) apply to it, and a malformed one makes
// ncclCommInitRank fail with ncclInvalidUsage.
// Buffers are host memory and streams are ignored: every call has finished when it returns.
// Built with NCCL_DOUBLE_ON_STREAMS (for the CUDA emulation of tests/gpu/emu), the collectives are
// queued on their stream instead (on_stream.cc) and buffers may be emulated device memory.
#pragma once
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

#include "lowrank/lowrank.h"

struct ncclComm {
  lowrankComm_t lr = nullptr;
  int rank = 0, nranks = 1;
  int device = 0;  // ncclCommCuDevice: ncclCommInitAll's devlist, else the device current at init
  std::atomic<int> asyncError{ncclSuccess};  // the first collective failure, for GetAsyncError

  // NCCL_DOUBLE_INPROGRESS=N at init (0: unset): a nonblocking communicator, as NCCL's with
  // ncclConfig_t.blocking = 0. Every collective (done at once, or queued on its stream) returns
  // ncclInProgress, and the next N ncclCommGetAsyncError calls report ncclInProgress before its
  // result; a huge N is a call that never finishes.
  unsigned long long inProgressPolls = 0;
  std::atomic<unsigned long long> pendingPolls{0};

  // ncclDoubleFailCollective: the collective call (counted down, 1 = the next) that returns
  // failWith at once; 0: none armed.
  std::mutex injectMu;
  unsigned long long failIn = 0;
  ncclResult_t failWith = ncclSuccess;

  // ncclCommAbort from another thread while a collective runs (NCCL's way to end a hang): abort
  // sets `aborting` under abortMu (after which collectives no longer touch `lr`), aborts `lr`
  // (which makes the running call return), and frees this struct once `inflight` is back to 0.
  std::mutex abortMu;
  bool aborting = false;
  std::atomic<bool> aborted{false};  // `aborting`, readable without the lock (stall gates)
  std::atomic<int> inflight{0};

  // ncclRedOpCreatePreMulSum: op ncclNumOps + i is preMul[i].
  struct PreMul {
    bool live = false;
    ncclDataType_t dtype = ncclFloat32;
    ncclScalarResidence_t residence = ncclScalarHostImmediate;
    const void* ptr = nullptr;             // ncclScalarDevice: read at every call
    unsigned char value[8] = {};           // ncclScalarHostImmediate: read at creation
  };
  std::mutex opsMu;
  std::vector<PreMul> preMul;
};

namespace nccl_double {

// Records `msg` as this thread's last error (ncclGetLastError) and returns r.
ncclResult_t fail(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Maps a lowrank result to NCCL's (the codes 0..7 are shared; lowrankTimeout -> ncclRemoteError)
// and records lowrank's message, prefixed by `what`.
ncclResult_t fromLowrank(lowrankResult_t r, lowrankComm_t lr, const char* what);

// Element size of an NCCL dtype the double handles (all but the fp8 types); 0 otherwise.
size_t dtypeSize(ncclDataType_t t);
// Checks a dtype (and names `what` in the error): ncclSuccess or ncclInvalidArgument.
// t as an int: the entry points check a caller's datatype before it is used as the enum (a C
// caller may pass any int; C++ may not load an enum outside its range: lowrank::cEnumValue).
ncclResult_t checkDtype(int t, const char* what);

// ncclDoubleFailCollective's injection: counts a collective call `what` on comm, and returns the
// armed result (recorded as the last error) if this is the call it was armed for, else ncclSuccess.
ncclResult_t injectedFailure(ncclComm_t comm, const char* what);

// Communicators made and not yet destroyed or aborted, in this process (ncclDoubleLiveComms).
int liveComms();
// ncclDoubleStallCollectives: whether collectives queued now never complete (until their comm is
// aborted or the stall lifted).
bool stalled();
void setStalled(bool on);

// A collective's result r as a nonblocking comm returns it (NCCL_DOUBLE_INPROGRESS): a success
// becomes ncclInProgress, with comm's next polls armed; anything else, or a blocking comm, is r.
ncclResult_t asIssued(ncclComm_t comm, ncclResult_t r);

// The implementations behind both exported names (ncclX and pncclX) of each entry point.
ncclResult_t getVersion(int* version);
ncclResult_t getUniqueId(ncclUniqueId* id);
ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                ncclConfig_t* config);
ncclResult_t commInitAll(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t commFinalize(ncclComm_t comm);
ncclResult_t commDestroy(ncclComm_t comm);
ncclResult_t commAbort(ncclComm_t comm);
ncclResult_t commCount(const ncclComm_t comm, int* count);
ncclResult_t commUserRank(const ncclComm_t comm, int* rank);
ncclResult_t commCuDevice(const ncclComm_t comm, int* device);
ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
const char* getErrorString(ncclResult_t r);
const char* getLastError(ncclComm_t comm);
ncclResult_t groupStart();
ncclResult_t groupEnd();

ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm);

ncclResult_t allReduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                       ncclRedOp_t op, ncclComm_t comm);
ncclResult_t broadcast(const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
                       ncclComm_t comm);
ncclResult_t allGather(const void* send, void* recv, size_t sendcount, ncclDataType_t dtype,
                       ncclComm_t comm);
ncclResult_t reduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                           ncclRedOp_t op, ncclComm_t comm);
ncclResult_t reduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                    ncclRedOp_t op, int root, ncclComm_t comm);

// NCCL_DOUBLE_ON_STREAMS: queues run on stream (a collective of comm named `what`).
ncclResult_t onStream(cudaStream_t stream, ncclComm_t comm, const char* what,
                      std::function<ncclResult_t()> run);

}  // namespace nccl_double
