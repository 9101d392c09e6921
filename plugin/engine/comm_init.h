// The making of a communicator's transport, for the API layer (which sees the engine only): over
// UCX from a lowrank unique id, over an NCCL communicator, or from a launcher's environment; and
// NCCL's own unique id and communicator for lowrankCommInitNcclRank. The argument checks of the C
// API come before these; each returns the error of the layer that failed (its message names it).
// Thread safety: as the C API's init calls (any thread; a comm being made is the caller's alone).
#pragma once
#include "engine/communicator.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

// lowrankGetUniqueId: a unique id whose rendezvous (comm rank 0's server) lives until the comm is
// made or timeoutSec passes.
Status makeUniqueId(lowrankUniqueId* id, double timeoutSec);

// c's transport over UCX, as comm rank `rank` of `nranks` (c->cfg resolved already).
Status connectUcx(lowrankComm* c, const lowrankUniqueId& id, int rank, int nranks);

// c's transport over the NCCL communicator `ncclComm` (an ncclComm_t; owned: c releases it, see
// deleteComm), with c's rank and size taken from it.
Status connectNccl(lowrankComm* c, void* ncclComm, bool owned);

// The launcher's comm rank and size (torchrun, mpirun, srun variables) and the unique id every
// process of the job derives from them (comm rank 0 serves it).
Status launcherUniqueId(double timeoutSec, lowrankUniqueId* id, int* rank, int* size);

// ncclGetUniqueId and ncclCommInitRank of the real NCCL (id: an ncclUniqueId, 128 bytes).
Status ncclUniqueId(void* id);
Status ncclCommInit(void** ncclComm, int nranks, const void* id, int rank);

// True if p is device memory (platform/cuda_probe.h: asks a CUDA driver the process has loaded).
bool isDeviceBuffer(const void* p);

}  // namespace lowrank
