// The shim's side of lowrank: the lowrank communicator over an NCCL one, compressed calls, state
// releases. Callers hold ShimComm::mu. Failures are printed (always) and returned as NCCL codes.
#pragma once
#include <nccl.h>

#include <vector>

#include "nccl_shim/comm_registry.h"
#include "nccl_shim/group.h"

namespace lowrank::shim {

// Makes c.lr (lowrankCommInitFromNccl: the LOWRANK_* variables configure it) at the first
// eligible call; not collective. A failure is kept and returned by every later call.
ncclResult_t ensureLowrank(ShimComm& c);

// Drops the state of these buffers (lowrankBufferRelease) and forgets their applied layouts.
void releaseBuffers(ShimComm& c, const std::vector<const void*>& bufs);

// One compressed allreduce: the buffer's layout hint if new, lowrankAllReduce on the call's
// stream, the counters. An error after the plan (the output may be half written) is printed and
// returned (ncclSystemError, ncclRemoteError, ncclInvalidUsage or ncclInternalError).
ncclResult_t runCompressed(ShimComm& c, const RecordedCall& call);

// lowrank's result code as NCCL's.
ncclResult_t toNccl(lowrankResult_t r);

}  // namespace lowrank::shim
