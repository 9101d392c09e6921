// Dispatch of one allreduce: exact or compressed, and the buffer's state around it.
#include <cstdio>
#include <cstring>
#include <new>

#include "engine/communicator.h"
#include "engine/powersgd.h"
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

// Makes the plan of a buffer at its first call, checks that every rank made the same one, and
// allocates its state. Collective (one small allreduce), so every rank must reach it together.
Status planBuffer(lowrankComm* comm, BufferState& st, size_t count, lowrankDataType_t dtype,
                  lowrankRedOp_t op, const void* buf) {
  Plan plan;
  Status s = makePlan(count, dtype, op, st.layout ? &*st.layout : nullptr, comm->cfg, &plan);
  // A local planning error still takes part in the hash exchange, so that peers do not hang.
  uint64_t h[2] = {s.ok() ? plan.hash : 0, s.ok() ? ~plan.hash : 0};
  LR_RETURN_IF_ERROR(comm->transport->allreduce(h, 2, lowrankUint64, lowrankMax));
  if (!s.ok()) return s;
  if (h[0] != plan.hash || h[1] != ~plan.hash)
    return Status::Error(lowrankInvalidUsage,
                         "buffer %p: comm ranks disagree on (count, dtype, op, layout, k); this "
                         "rank has count %zu, dtype %s, op %s",
                         buf, count, dtypeName(dtype), opName(op));
  try {
    if (comm->cfg.errorFeedback) st.error.assign(count, 0.f);
    st.payload.assign(plan.payloadElems(), 0.f);
    st.qt.assign(plan.qElems, 0.f);
    if (plan.pipelined) st.qwire.assign(plan.qElems, 0.f);
  } catch (const std::bad_alloc&) {
    st.reset();
    return Status::Error(lowrankSystemError, "buffer %p: cannot allocate state for %zu elements",
                         buf, count);
  }
  st.plan = std::move(plan);
  st.planned = true;
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
  if (pl.compressedElems == 0 || warmup) return exactAllReduce(comm, send, recv, count, dtype, op);

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

}  // namespace

Status allReduce(lowrankComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                 lowrankDataType_t dtype, lowrankRedOp_t op) {
  const bool compress = comm->cfg.approxRank > 0 && dtypeCompressible(dtype) &&
                        (op == lowrankSum || op == lowrankAvg);
  Status s = compress ? compressedAllReduce(comm, sendbuff, recvbuff, count, dtype, op)
                      : exactAllReduce(comm, sendbuff, recvbuff, count, dtype, op);
  if (s.ok()) {
    ++comm->counters.calls;
  } else if (s.code != lowrankInvalidArgument && s.code != lowrankInvalidUsage) {
    // A collective broke midway: the ranks may now be at different points of the call sequence,
    // so refuse further calls. (Usage errors are agreed by all ranks at plan time.)
    comm->failed = true;
    // Name the buffer: a rank that skipped a call shows up here as a timeout on the others.
    char what[160];
    snprintf(what, sizeof what, "allreduce of buffer %p (count %zu, %s, %s), call %llu: ", recvbuff,
             count, dtypeName(dtype), opName(op), (unsigned long long)comm->counters.calls + 1);
    s.msg = what + s.msg;
  }
  return s;
}

}  // namespace lowrank
