#include "nccl_shim/compress.h"

#include "lowrank/lowrank_nccl.h"
#include "nccl_shim/guard.h"
#include "nccl_shim/layout_hint.h"
#include "nccl_shim/shim_log.h"
#include "util/dtype.h"  // dtypeSize (header only)

namespace lowrank::shim {
namespace {

// Gives lowrank the layout hint of the buffer if this communicator has not applied it yet.
// A hint whose elements do not add up to the call's count is stale (the address now holds another
// buffer, e.g. after DDP rebuilt its buckets): it is ignored, the buffer stays batched.
lowrankResult_t applyLayout(ShimComm& c, const void* recv, size_t count) {
  std::shared_ptr<const LayoutHint> h = layoutHint(recv);
  if (!h) return lowrankSuccess;
  uint64_t& applied = c.layouts[recv];
  if (applied == h->version) return lowrankSuccess;
  if (h->elements != count) {
    SHIM_INFO("comm %p: the layout hint of buffer %p has %zu elements, the call %zu: ignored",
              (void*)c.nccl, recv, h->elements, count);
    applied = h->version;
    return lowrankSuccess;
  }
  std::vector<const size_t*> shapes;
  size_t at = 0;
  for (int nd : h->ndims) {
    shapes.push_back(h->dims.data() + at);
    at += size_t(nd);
  }
  lowrankResult_t r = lowrankBufferSetLayout(c.lr.load(), recv, int(h->ndims.size()),
                                             h->ndims.data(), shapes.data());
  if (r == lowrankSuccess) applied = h->version;
  return r;
}

}  // namespace

ncclResult_t toNccl(lowrankResult_t r) {
  switch (r) {
    case lowrankSuccess: return ncclSuccess;
    case lowrankUnhandledCudaError: return ncclUnhandledCudaError;
    case lowrankSystemError:
    case lowrankTimeout: return ncclSystemError;
    case lowrankRemoteError: return ncclRemoteError;
    case lowrankInvalidArgument:
    case lowrankInvalidUsage: return ncclInvalidUsage;
    default: return ncclInternalError;
  }
}

ncclResult_t ensureLowrank(ShimComm& c) {
  if (c.lr.load()) return ncclSuccess;
  if (c.initError != ncclSuccess) {
    setLastError(c.initMessage.c_str());
    return c.initError;
  }
  // No config: the LOWRANK_* variables configure it as any lowrank communicator, so
  // LOWRANK_START_ITER is the engine's per-buffer warm-up here too (one place applies it).
  lowrankComm_t lr = nullptr;
  lowrankResult_t r;
  {
    Guard g;
    r = lowrankCommInitFromNccl(&lr, c.nccl);
  }
  if (r != lowrankSuccess) {
    c.initError = toNccl(r);
    SHIM_ERROR("comm %p: cannot make the lowrank communicator (lowrank result %d): %s; its "
               "eligible allreduces fail with NCCL error %d",
               (void*)c.nccl, int(r), lowrankGetLastError(nullptr), int(c.initError));
    if (const char* m = lastError()) c.initMessage = m;
    return c.initError;
  }
  c.lr.store(lr);
  Guard g;
  lowrankGetStats(lr, &c.lastStats);
  if (c.rank < 0) lowrankCommUserRank(lr, &c.rank);  // NCCL could not say at the first call
  SHIM_INFO("comm %p (comm rank %d of %d): lowrank communicator made", (void*)c.nccl, c.rank,
            c.nranks);
  return ncclSuccess;
}

void releaseBuffers(ShimComm& c, const std::vector<const void*>& bufs) {
  lowrankComm_t lr = c.lr.load();
  for (const void* b : bufs) {
    c.layouts.erase(b);
    if (!lr) continue;
    Guard g;
    lowrankBufferRelease(lr, b);
    SHIM_TRACE("comm %p: state of buffer %p released", (void*)c.nccl, b);
  }
}

ncclResult_t runCompressed(ShimComm& c, const RecordedCall& call) {
  lowrankComm_t lr = c.lr.load();
  if (!lr || c.aborted.load()) {
    SHIM_ERROR("comm %p: compressed allreduce after the communicator was aborted", (void*)c.nccl);
    return ncclInvalidUsage;
  }
  lowrankResult_t r;
  bool planned = false;  // the error came from lowrankAllReduce, not from the layout
  {
    Guard g;
    r = applyLayout(c, call.recv, call.count);
    if (r == lowrankSuccess) {
      planned = true;
      r = lowrankAllReduce(call.send, call.recv, call.count, lowrankDataType_t(call.dtype),
                           lowrankRedOp_t(call.op), lr, call.stream);
    }
  }
  if (r != lowrankSuccess) {
    // Another thread's ncclCommAbort may have freed lr: read nothing more from it then.
    const char* msg = c.aborted.load() ? "the communicator was aborted" : lowrankGetLastError(lr);
    SHIM_ERROR("comm %p (comm rank %d of %d): compressed allreduce of buffer %p (%zu %s, %s) "
               "failed in %s (lowrank result %d): %s. The output buffer may be partly written; "
               "the allreduce is not retried",
               (void*)c.nccl, c.rank, c.nranks, call.recv, call.count,
               plugin::pluginServices().dtypeName(call.dtype), plugin::pluginServices().opName(call.op),
               planned ? "lowrankAllReduce" : "lowrankBufferSetLayout", int(r), msg);
    // As NCCL would say it: a usage error inside (comm ranks that disagree on the call) stays one.
    return toNccl(r);
  }
  lowrankStats_t s{};
  {
    Guard g;
    lowrankGetStats(lr, &s);
  }
  const lowrankStats_t& p = c.lastStats;
  const uint64_t dCompressed = s.compressedCalls - p.compressedCalls;
  const int64_t dElems = int64_t(s.compressedElements - p.compressedElements);
  const int64_t dFactors = int64_t(s.payloadElements - p.payloadElements) -
                           int64_t(s.exactElements - p.exactElements);  // P and Q, float32
  if (dCompressed) {
    c.compressed += dCompressed;
    c.bytesSaved += dElems * int64_t(dtypeSize(call.dtype)) - dFactors * 4;
  } else {
    c.exactInLowrank += 1;  // warm-up (startIter), or a fallback (allocation, non-finite input)
  }
  c.lastStats = s;
  return ncclSuccess;
}

}  // namespace lowrank::shim
