// Dispatch of one allreduce: exact or compressed, and the buffer's state around it.
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "engine/communicator.h"
#include "engine/device_engine.h"
#include "engine/powersgd.h"
#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

Status exactAllReduce(lowrankComm* comm, const void* send, void* recv, size_t count,
                      lowrankDataType_t dtype, lowrankRedOp_t op) {
  if (send != recv) std::memcpy(recv, send, count * dtypeSize(dtype));
  LR_RETURN_IF_ERROR(comm->transport->allreduce(recv, count, dtype, op));
  comm->counters.exactElements += count;
  comm->counters.payloadElements += count;
  return Status::Ok();
}

// Allocates the state of a planned buffer; false if memory ran out (or the test asks for it).
bool allocateState(const lowrankComm* comm, BufferState& st, const Plan& plan) {
  if (comm->cfg.testFailAllocRank == comm->rank) return false;
  try {
    if (comm->cfg.errorFeedback) st.error.assign(plan.count, 0.f);
    st.payload.assign(plan.payloadElems(), 0.f);
    st.qt.assign(plan.qElems, 0.f);
    if (plan.pipelined) st.qwire.assign(plan.qElems, 0.f);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

// Makes the plan of a buffer at its first call and allocates its state, then checks with one
// small allreduce that every rank made the same plan and could allocate. Collective, so every
// rank must reach it together. If any rank could not allocate, every rank marks the buffer
// exactOnly: the decision is common, so the ranks keep issuing the same collectives.
Status planBuffer(lowrankComm* comm, BufferState& st, size_t count, lowrankDataType_t dtype,
                  lowrankRedOp_t op, const void* buf) {
  Plan plan;
  Status s = makePlan(count, dtype, op, st.layout ? &*st.layout : nullptr, comm->cfg, &plan);
  const bool allocated = s.ok() && allocateState(comm, st, plan);
  PlanCheck check(s, plan, allocated);
  Status x = comm->transport->allreduce(check.words, 3, lowrankUint64, lowrankMax);
  bool exactOnly = false;
  if (x.ok() && s.ok()) x = check.read(plan, op, buf, allocated, &exactOnly);
  if (!x.ok() || !s.ok()) {
    st.reset();
    if (s.ok()) return x;
    if (x.ok()) return s;
    // This rank's own mistake (a layout set here only, after the other ranks planned) comes first;
    // the plan check then met another collective, which broke the communicator.
    return Status::Error(s.code, "%s; and the plan check with the other comm ranks failed, as they "
                         "did not make it (was the layout set on this rank only?): %s",
                         s.msg.c_str(), x.msg.c_str());
  }
  st.plan = std::move(plan);
  st.planned = true;
  if (exactOnly) {
    std::vector<float>().swap(st.error);
    std::vector<float>().swap(st.payload);
    std::vector<float>().swap(st.qt);
    std::vector<float>().swap(st.qwire);
    st.exactOnly = true;
    return Status::Ok();
  }
  LR_INFO("buffer %p planned: count %zu %s, %s, %zu tensors (%zu compressed elements), P %zu Q %zu "
          "exact %zu, %s",
          buf, count, dtypeName(dtype), st.plan.perTensor ? "per-tensor" : "batched",
          st.plan.tensors.size(), st.plan.compressedElems, st.plan.pElems, st.plan.qElems,
          st.plan.exactElems, st.plan.pipelined ? "pipelined" : "one phase after another");
  return Status::Ok();
}

Status compressedAllReduce(lowrankComm* comm, const void* send, void* recv, size_t count,
                           lowrankDataType_t dtype, lowrankRedOp_t op) {
  BufferState& st = comm->buffers.get(recv);
  if (st.planned && (st.plan.count != count || st.plan.dtype != dtype)) {
    LR_INFO("buffer %p: count or dtype changed, state reset", recv);
    st.reset();
  }
  if (!st.planned) LR_RETURN_IF_ERROR(planBuffer(comm, st, count, dtype, op, recv));
  const Plan& pl = st.plan;
  const bool warmup = st.calls < uint64_t(comm->cfg.startIter);
  ++st.calls;
  if (pl.compressedElems == 0 || warmup || st.exactOnly)
    return exactAllReduce(comm, send, recv, count, dtype, op);

  CompressedResult r;
  Status s = pl.pipelined
                 ? runPipelined(st, comm->cfg, send, recv, op, *comm->transport, &r)
                 : runCompressed(st, comm->cfg, send, recv, op, *comm->transport, &r);
  if (!s.ok()) {
    st.reset();  // E may hold M: never keep a half-updated state
    return s;
  }
  if (r.fellBack) {
    LR_INFO("buffer %p: non-finite input on some comm rank; exact allreduce, state reset", recv);
    st.reset();
    ++comm->counters.fallbackCalls;
    return exactAllReduce(comm, send, recv, count, dtype, op);
  }
  ++comm->counters.compressedCalls;
  comm->counters.compressedElements += pl.compressedElems;
  comm->counters.exactElements += pl.exactElems;
  comm->counters.payloadElements += pl.pElems + pl.qElems + pl.exactElems;
  return Status::Ok();
}


// Device buffers: the device engine (device_engine.h), made at the first device buffer of the
// communicator; it loads the CUDA backend.
Status deviceAllReduce(lowrankComm* comm, const void* send, void* recv, size_t count,
                       lowrankDataType_t dtype, lowrankRedOp_t op, void* stream, bool compress) {
  if (!comm->ncclComm)
    return Status::Error(lowrankInvalidUsage,
                         "device buffers need a communicator made by lowrankCommInitFromNccl "
                         "(this one moves host memory only)");
  // CUDA graph capture: a compressed call would change per-buffer state that a replay never sees,
  // so it is refused; an uncompressed call is NCCL's own, which NCCL lets the graph capture.
  if (platform::streamCapturing(stream)) {
    if (compress)
      return Status::Error(lowrankInvalidUsage,
                           "device buffer %p: a compressed allreduce cannot be captured into a "
                           "CUDA graph (its state changes at every call); call it outside the "
                           "graph", recv);
    const nccl::Api* api = nullptr;
    LR_RETURN_IF_ERROR(nccl::realNccl(&api));
    return nccl::fromNccl(*api, api->allReduce(send, recv, count, dtype, op, comm->ncclComm, stream),
                          "ncclAllReduce (captured)");
  }
  if (!comm->device) {
    DeviceCommDesc d;
    d.ncclComm = comm->ncclComm;
    d.rank = comm->rank;
    d.nranks = comm->nranks;
    d.cfg = comm->cfg;
    LR_RETURN_IF_ERROR(DeviceEngine::create(d, &comm->device));
  }
  const BufferState* st = comm->buffers.find(recv);
  return comm->device->allReduce(send, recv, count, dtype, op, stream,
                                 st && st->layout ? &*st->layout : nullptr);
}

}  // namespace

Status allReduce(lowrankComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                 lowrankDataType_t dtype, lowrankRedOp_t op, void* stream, bool device) {
  const bool compress = comm->cfg.approxRank > 0 && dtypeCompressible(dtype) &&
                        (op == lowrankSum || op == lowrankAvg);
  Status s = device    ? deviceAllReduce(comm, sendbuff, recvbuff, count, dtype, op, stream, compress)
             : compress ? compressedAllReduce(comm, sendbuff, recvbuff, count, dtype, op)
                        : exactAllReduce(comm, sendbuff, recvbuff, count, dtype, op);
  if (s.ok()) {
    ++comm->counters.calls;
  } else if ((s.code != lowrankInvalidArgument && s.code != lowrankInvalidUsage) ||
             comm->transport->broken()) {
    // A collective broke midway: the ranks may now be at different points of the call sequence,
    // so refuse further calls. (Usage errors found at plan time are agreed by all ranks and leave
    // the communicator usable; one the transport found midway, such as counts that differ after
    // the plan, does not.)
    comm->failed = true;
    // Name the buffer: a rank that skipped a call shows up here as a timeout on the others.
    char what[160];
    snprintf(what, sizeof what, "allreduce of buffer %p (count %zu, %s, %s), call %llu: ", recvbuff,
             count, dtypeName(dtype), opName(op), (unsigned long long)comm->counters.calls + 1);
    s.msg = what + s.msg;
    comm->failure = s.msg;
  }
  return s;
}

}  // namespace lowrank
