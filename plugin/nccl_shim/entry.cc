// The NCCL entry points the shim defines (in front of the real library, or in the drop-in):
// ncclAllReduce, the group calls, the communicator's end (destroy, finalize, abort) and premulsum
// ops. Everything else of NCCL is the real library's (preload) or forwarded to it (drop-in).
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "nccl_shim/compress.h"
#include "nccl_shim/guard.h"
#include "nccl_shim/last_error.h"
#include "nccl_shim/real_nccl.h"
#include "nccl_shim/settings.h"
#include "nccl_shim/shim_log.h"
#include "util/dtype.h"  // header only

#define SHIM_API extern "C" __attribute__((visibility("default")))

using namespace lowrank::shim;

namespace {

// True if `stream` is being captured into a CUDA graph. A compressed allreduce cannot be captured
// (its state changes at every call and a replay would not see it), so such calls go to NCCL as
// they are, which NCCL lets the graph capture. liblowrank's probe (platform/cuda_probe.h); no CUDA
// runtime reachable (a static one): false, and lowrank itself refuses the capture with an error.
bool capturing(cudaStream_t stream) { return lowrank::plugin::pluginServices().streamCapturing(stream); }

// The real library could not be reached (real() printed why, once): this thread's last error.
ncclResult_t noRealNccl() {
  char msg[1024];
  snprintf(msg, sizeof msg, "lowrank NCCL shim: %s", realError());
  setLastError(msg);
  return ncclSystemError;
}

// True when the call must go straight to the real library: inside lowrank or the real NCCL
// (the guard), or with LOWRANK_ENABLE=0.
bool bypass() { return Guard::active() || (settings().ok && !settings().env.enable); }

ncclResult_t passThrough(const Real& r, ShimComm* c, const void* send, void* recv, size_t count,
                         ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                         cudaStream_t stream) {
  if (c) ++c->passedThrough;
  Guard g;
  return forwarded(r.allReduce(send, recv, count, dtype, op, comm, stream));
}

ncclResult_t allReduce(const Real& r, const void* send, void* recv, size_t count,
                       ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const Settings& s = settings();
  if (!comm || !send || !recv || count == 0)  // NCCL's own checks and messages apply
    return passThrough(r, nullptr, send, recv, count, dtype, op, comm, stream);
  std::shared_ptr<ShimComm> c = commFor(comm);
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->nranks < 1) queryRanks(*c);
  lowrank::plugin::pluginServices().setLogDevice(c->cudaDev);  // "[dev]" in this thread's log lines
  auto pm = c->preMul.find(int(op));
  const std::optional<int> mapped =
      mapOp(int(op), pm == c->preMul.end() ? nullptr : &pm->second, c->nranks);
  if (!mapped || !eligible(int(dtype), count, s.env.minBytes))
    return passThrough(r, c.get(), send, recv, count, dtype, op, comm, stream);
  if (ncclResult_t e = ensureLowrank(*c); e != ncclSuccess) return e;

  const CallKey key{recv, send == recv, count, int(dtype), *mapped};
  SequencePolicy::Decision d = c->policy.next(key);
  if (!d.release.empty()) releaseBuffers(*c, d.release);
  if (d.changed)
    SHIM_INFO("comm %p: the sequence of eligible allreduces changed at buffer %p (count %zu); "
              "exact until the new sequence has repeated %d times",
              (void*)comm, recv, count, SequencePolicy::kRepeats);
  if (d.started)
    SHIM_INFO("comm %p (comm rank %d of %d): a sequence of %zu allreduces repeated %d times: "
              "given to lowrank from now on (%zu buffers' state released)",
              (void*)comm, c->rank, c->nranks, c->policy.cycleLength(), c->policy.repeats(),
              d.release.size());
  if (!d.compress) return passThrough(r, c.get(), send, recv, count, dtype, op, comm, stream);
  if (capturing(stream)) {
    SHIM_INFO("comm %p: allreduce of %p inside CUDA graph capture: passed to NCCL uncompressed",
              (void*)comm, recv);
    return passThrough(r, c.get(), send, recv, count, dtype, op, comm, stream);
  }

  RecordedCall call{c, send, recv, count, dtype, *mapped, stream};
  if (group::depth() > 0) {  // run after the outermost ncclGroupEnd
    group::record(std::move(call));
    return ncclSuccess;
  }
  return runCompressed(*c, call);
}

// Destroy, finalize and abort: the lowrank communicator goes first, with the report line.
ncclResult_t endComm(ncclComm_t comm, const char* when, bool abort) {
  std::shared_ptr<ShimComm> c = findComm(comm, /*take=*/true);
  if (!c) return ncclSuccess;
  if (abort) {
    // Not under c->mu: a call may be blocked in lowrank on another thread; lowrankCommAbort makes
    // it return.
    c->aborted = true;
    reportComm(*c, when);
    if (lowrankComm_t lr = c->lr.exchange(nullptr)) {
      Guard g;
      lowrankCommAbort(lr);
    }
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(c->mu);
  reportComm(*c, when);
  if (lowrankComm_t lr = c->lr.exchange(nullptr)) {
    Guard g;
    if (lowrankResult_t r = lowrankCommDestroy(lr); r != lowrankSuccess)
      SHIM_ERROR("comm %p: lowrankCommDestroy failed (lowrank result %d)", (void*)comm, int(r));
  }
  return ncclSuccess;
}

}  // namespace

SHIM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (bypass()) {
    Guard g;
    return forwarded(r->allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
  }
  if (!settings().ok) {
    setLastError(settings().error.c_str());
    return ncclInvalidUsage;
  }
  return allReduce(*r, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

SHIM_API ncclResult_t ncclGroupStart() {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (bypass()) {
    Guard g;
    return forwarded(r->groupStart());
  }
  ncclResult_t res;
  {
    Guard g;
    res = forwarded(r->groupStart());
  }
  if (res == ncclSuccess) group::start();
  return res;
}

// Closes a group (ncclGroupEnd, or ncclGroupSimulateEnd with `simulate`); after the outermost one,
// runs the recorded compressed calls in order (a simulation drops them: nothing ran).
static ncclResult_t groupEnd(const Real& r, ncclSimInfo_t* sim, bool simulate) {
  ncclResult_t res;
  {
    Guard g;
    res = forwarded(simulate ? r.groupSimulateEnd(sim) : r.groupEnd());
  }
  if (!group::end()) return res;
  std::vector<RecordedCall> calls = group::takeRecorded();
  if (calls.empty() || simulate) return res;
  if (res != ncclSuccess && res != ncclInProgress) {
    SHIM_ERROR("ncclGroupEnd failed (%d): the group's %zu compressed allreduces were not run",
               int(res), calls.size());
    return res;
  }
  for (const RecordedCall& call : calls) {
    std::lock_guard<std::mutex> lock(call.comm->mu);
    if (ncclResult_t e = runCompressed(*call.comm, call); e != ncclSuccess) return e;
  }
  return res;
}

SHIM_API ncclResult_t ncclGroupEnd() {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (bypass()) {
    Guard g;
    return forwarded(r->groupEnd());
  }
  return groupEnd(*r, nullptr, false);
}

SHIM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!r->groupSimulateEnd) {
    SHIM_ERROR("the NCCL library %s has no ncclGroupSimulateEnd", r->path);
    return ncclInvalidUsage;
  }
  if (bypass()) {
    Guard g;
    return forwarded(r->groupSimulateEnd(simInfo));
  }
  return groupEnd(*r, simInfo, true);
}

SHIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!bypass()) endComm(comm, "destroyed", false);
  Guard g;
  return forwarded(r->commDestroy(comm));
}

SHIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!r->commFinalize) {
    SHIM_ERROR("the NCCL library %s has no ncclCommFinalize", r->path);
    return ncclInvalidUsage;
  }
  if (!bypass()) endComm(comm, "finalized", false);
  Guard g;
  return forwarded(r->commFinalize(comm));
}

SHIM_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!bypass()) endComm(comm, "aborted", true);
  Guard g;
  return forwarded(r->commAbort(comm));
}

SHIM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                               ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!r->redOpCreatePreMulSum) {
    SHIM_ERROR("the NCCL library %s has no ncclRedOpCreatePreMulSum", r->path);
    return ncclInvalidUsage;
  }
  ncclResult_t res;
  {
    Guard g;
    res = forwarded(r->redOpCreatePreMulSum(reinterpret_cast<int*>(op), scalar, datatype, residence, comm));
  }
  if (res != ncclSuccess || bypass() || !settings().ok || !op || !scalar || !comm) return res;
  // A host scalar is read now, as NCCL does; a device scalar is unknown here (never compressed).
  std::shared_ptr<ShimComm> c = commFor(comm);
  std::lock_guard<std::mutex> lock(c->mu);
  // Only floating scalars can make sum or avg (policy.h: mapOp); the dtype is checked as an int
  // before it is read as one (a caller's number may lie outside the enum).
  const int dtype = int(datatype);
  const size_t size = lowrank::dtypeMantissaBits(dtype) ? lowrank::dtypeSize(dtype) : 0;
  if (residence == ncclScalarHostImmediate && size) {
    PreMulSum p;
    p.dtype = dtype;
    std::memcpy(p.value, scalar, size);
    c->preMul[int(*op)] = p;
  } else {
    c->preMul.erase(int(*op));
  }
  return res;
}

// NCCL's last error text, with the shim's own failures (last_error.h) in front of the real
// library's.
SHIM_API const char* ncclGetLastError(ncclComm_t comm) {
  if (const char* mine = lastError()) return mine;
  const Real* r = real();
  if (!r) return realError();
  if (!r->getLastError) return "";
  Guard g;
  return r->getLastError(comm);
}

SHIM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const Real* r = real();
  if (!r) return noRealNccl();
  if (!r->redOpDestroy) {
    SHIM_ERROR("the NCCL library %s has no ncclRedOpDestroy", r->path);
    return ncclInvalidUsage;
  }
  if (!bypass() && comm)
    if (std::shared_ptr<ShimComm> c = findComm(comm, false)) {
      std::lock_guard<std::mutex> lock(c->mu);
      c->preMul.erase(int(op));
    }
  Guard g;
  return forwarded(r->redOpDestroy(op, comm));
}
