// The NCCL test double: communicators, errors, groups and the version (see double.h).
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "double.h"
#ifdef NCCL_DOUBLE_ON_STREAMS
#include <cuda_runtime_api.h>  // the CUDA emulation's: the device current at init
#endif

static_assert(sizeof(ncclUniqueId) == sizeof(lowrankUniqueId), "an ncclUniqueId carries a lowrankUniqueId");

namespace nccl_double {
namespace {

thread_local std::string lastError;  // NCCL's last error is not per comm either
thread_local int groupDepth = 0;
std::atomic<int> live{0};  // communicators made and not yet destroyed or aborted
std::atomic<bool> stall{false};  // ncclDoubleStallCollectives

constexpr unsigned int kNcclConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic

}  // namespace

ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  lastError = buf;
  return r;
}

ncclResult_t fromLowrank(lowrankResult_t r, lowrankComm_t lr, const char* what) {
  if (r == lowrankSuccess) return ncclSuccess;
  ncclResult_t n = r <= lowrankInProgress ? ncclResult_t(r)
                   : r == lowrankTimeout  ? ncclRemoteError  // NCCL has no timeout code
                                          : ncclInternalError;
  return fail(n, "%s: %s: %s", what, lowrankGetErrorString(r), lowrankGetLastError(lr));
}

size_t dtypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

ncclResult_t checkDtype(int t, const char* what) {
  if (t < 0 || t >= int(ncclNumTypes) || (t != ncclFloat8e4m3 && t != ncclFloat8e5m2 &&
                                           dtypeSize(ncclDataType_t(t)) == 0))
    return fail(ncclInvalidArgument, "%s: unknown datatype %d", what, t);
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
    return fail(ncclInvalidArgument, "%s: the NCCL test double does not implement fp8 (datatype %d)",
                what, t);
  return ncclSuccess;
}

ncclResult_t injectedFailure(ncclComm_t comm, const char* what) {
  if (!comm) return ncclSuccess;  // the collective itself refuses a null comm
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> lock(comm->injectMu);
    if (comm->failIn == 0 || --comm->failIn > 0) return ncclSuccess;
    r = comm->failWith;
    comm->failWith = ncclSuccess;
  }
  return fail(r, "%s: failure injected by ncclDoubleFailCollective (comm rank %d)", what, comm->rank);
}

int liveComms() { return live.load(); }
bool stalled() { return stall.load(); }
void setStalled(bool on) { stall = on; }

ncclResult_t asIssued(ncclComm_t comm, ncclResult_t r) {
  if (!comm || r != ncclSuccess || comm->inProgressPolls == 0) return r;
  comm->pendingPolls.store(comm->inProgressPolls);
  return ncclInProgress;
}

ncclResult_t getVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;  // the header the double was built against
  return ncclSuccess;
}

ncclResult_t getUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  lowrankUniqueId lid;
  lowrankResult_t r = lowrankGetUniqueId(&lid);
  if (r != lowrankSuccess) return fromLowrank(r, nullptr, "ncclGetUniqueId");
  std::memcpy(id->internal, lid.internal, sizeof lid.internal);
  return ncclSuccess;
}

ncclResult_t commInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (config && (config->size != sizeof(ncclConfig_t) || config->magic != kNcclConfigMagic))
    return fail(ncclInvalidArgument, "ncclCommInitRankConfig: config not initialized with "
                                     "NCCL_CONFIG_INITIALIZER");
  // Other config fields (blocking, CTAs, ...) mean nothing here: init is always blocking.
  lowrankUniqueId lid;
  std::memcpy(lid.internal, id.internal, sizeof lid.internal);
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 0;  // explicit, so LOWRANK_APPROX_RANK never makes the double compress
  auto c = std::make_unique<ncclComm>();
  lowrankResult_t r = lowrankCommInitRankConfig(&c->lr, nranks, lid, rank, &cfg);
  if (r != lowrankSuccess) return fromLowrank(r, nullptr, "ncclCommInitRank");
  c->rank = rank;
  c->nranks = nranks;
#ifdef NCCL_DOUBLE_ON_STREAMS
  if (cudaGetDevice(&c->device) != cudaSuccess) c->device = 0;
#endif
  if (const char* v = getenv("NCCL_DOUBLE_INPROGRESS")) c->inProgressPolls = strtoull(v, nullptr, 10);
  *comm = c.release();
  ++live;
  return ncclSuccess;
}

ncclResult_t commInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms) return fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL");
  // Calls run at once (no deferred group launch), so one thread cannot drive several comm ranks.
  if (ndev != 1)
    return fail(ncclInvalidUsage, "ncclCommInitAll: the NCCL test double makes one comm rank per "
                                  "thread or process; ndev %d != 1 (use ncclCommInitRank)", ndev);
  ncclUniqueId id;
  ncclResult_t r = getUniqueId(&id);
  if (r == ncclSuccess) r = commInitRankConfig(comms, 1, id, 0, nullptr);
  if (r == ncclSuccess) (*comms)->device = devlist ? devlist[0] : 0;  // NCCL's: devlist or 0..
  return r;
}

ncclResult_t commFinalize(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return ncclSuccess;  // nothing is ever pending
}

// NCCL accepts a null comm in Destroy and Abort.
ncclResult_t commDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  lowrankResult_t r = lowrankCommDestroy(comm->lr);
  delete comm;
  --live;
  return fromLowrank(r, nullptr, "ncclCommDestroy");
}

ncclResult_t commAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(comm->abortMu);
    comm->aborting = true;
    comm->aborted = true;  // opens the gates of its stalled collectives: they now do nothing
  }
  lowrankResult_t r = lowrankCommAbort(comm->lr);  // a call in progress returns promptly
  while (comm->inflight.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
#ifndef NCCL_DOUBLE_ON_STREAMS
  delete comm;  // on streams it stays: its queued collectives may still run (and do nothing)
#endif
  --live;
  return fromLowrank(r, nullptr, "ncclCommAbort");
}

ncclResult_t commCount(const ncclComm_t comm, int* count) {
  if (!comm || !count)
    return fail(ncclInvalidArgument, "ncclCommCount: %s is NULL", comm ? "count" : "comm");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t commUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank)
    return fail(ncclInvalidArgument, "ncclCommUserRank: %s is NULL", comm ? "rank" : "comm");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t commCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device)
    return fail(ncclInvalidArgument, "ncclCommCuDevice: %s is NULL", comm ? "device" : "comm");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL", comm ? "asyncError" : "comm");
  unsigned long long n = comm->pendingPolls.load();
  while (n > 0 && !comm->pendingPolls.compare_exchange_weak(n, n - 1)) {
  }
  *asyncError = n > 0 ? ncclInProgress : ncclResult_t(comm->asyncError.load());
  return ncclSuccess;
}

const char* getErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* getLastError(ncclComm_t) { return lastError.c_str(); }

// Calls inside a group run at once (each is complete when it returns); the depth is kept so that
// an unmatched ncclGroupEnd is refused as NCCL refuses it.
ncclResult_t groupStart() {
  ++groupDepth;
  return ncclSuccess;
}

ncclResult_t groupEnd() {
  if (groupDepth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: not inside a group (no ncclGroupStart)");
  --groupDepth;
  return ncclSuccess;
}

}  // namespace nccl_double
