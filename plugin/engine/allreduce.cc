// lowrank::allReduce: the backend of the buffer (host or device), the buffer's life around the call
// (engine/lifecycle.h), and the communicator's failure when a collective broke midway.
#include <cstdio>

#include "engine/communicator.h"
#include "engine/lifecycle.h"
#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

// Device buffers: the CUDA backend, made at the first device buffer of the communicator.
Status deviceAllReduce(lowrankComm* comm, const Call& c) {
  if (!comm->ncclComm)
    return Status::Error(lowrankInvalidUsage,
                         "device buffers need a communicator made by lowrankCommInitFromNccl "
                         "(this one moves host memory only)");
  // CUDA graph capture: a compressed call would change per-buffer state that a replay never sees,
  // so it is refused; an uncompressed call is NCCL's own, which NCCL lets the graph capture.
  if (platform::streamCapturing(c.stream)) {
    if (compresses(comm->cfg, c.dtype, c.op))
      return Status::Error(lowrankInvalidUsage,
                           "device buffer %p: a compressed allreduce cannot be captured into a "
                           "CUDA graph (its state changes at every call); call it outside the "
                           "graph", c.recv);
    const nccl::Api* api = nullptr;
    LR_RETURN_IF_ERROR(nccl::realNccl(&api));
    return nccl::fromNccl(*api, api->allReduce(c.send, c.recv, c.count, c.dtype, c.op,
                                               comm->ncclComm, c.stream),
                          "ncclAllReduce (captured)");
  }
  if (!comm->device)
    LR_RETURN_IF_ERROR(DeviceBackend::create(comm->ncclComm, comm->nranks, comm->cfg, &comm->device));
  // Work goes to the communicator's device whatever the calling thread's current device is.
  platform::DeviceGuard guard(comm->device->device());
  setLogDevice(comm->device->device());
  comm->buffers.collectArrived(*comm->device, comm->counters);
  return runCall(*comm->device, comm->buffers, c, comm->cfg, comm->rank, comm->counters,
                 comm->scratchQ);
}

}  // namespace

Status allReduce(lowrankComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                 lowrankDataType_t dtype, lowrankRedOp_t op, void* stream, bool device) {
  const Call c{sendbuff, recvbuff, count, dtype, op, stream};
  Status s;
  if (device) {
    s = deviceAllReduce(comm, c);
  } else {
    if (!comm->host) comm->host = std::make_unique<HostBackend>(comm->cfg, *comm->transport);
    s = runCall(*comm->host, comm->buffers, c, comm->cfg, comm->rank, comm->counters,
                comm->scratchQ);
  }
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
