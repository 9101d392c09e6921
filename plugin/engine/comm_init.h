// What the API layer (which sees the engine only) needs before a communicator's engine exists
// (engine/engine.h makes that one): unique ids, lowrank's and NCCL's, the launcher's environment,
// NCCL's own communicator for lowrankCommInitNcclRank, and whether a buffer is device memory. The
// argument checks of the C API come before these; each returns the error of the layer that failed.
// Thread safety: as the C API's init calls (any thread; a comm being made is the caller's alone).
#pragma once
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

// lowrankGetUniqueId: a unique id whose rendezvous (comm rank 0's server) lives until the comm is
// made or timeoutSec passes.
Status makeUniqueId(lowrankUniqueId* id, double timeoutSec);

// The launcher's comm rank and size (torchrun, mpirun, srun variables) and the unique id every
// process of the job derives from them (comm rank 0 serves it).
Status launcherUniqueId(double timeoutSec, lowrankUniqueId* id, int* rank, int* size);

// ncclGetUniqueId and ncclCommInitRank of the real NCCL (id: an ncclUniqueId, 128 bytes); an
// init NCCL makes nonblocking (NCCL_COMM_BLOCKING=0) is waited for, at most timeoutSec.
Status ncclUniqueId(void* id);
Status ncclCommInit(void** ncclComm, int nranks, const void* id, int rank, double timeoutSec);

// The real NCCL lowrank uses (platform/nccl.h's order; loads it if not yet loaded): its path,
// where it was found, and ncclGetVersion's code. The strings live as long as the process.
Status ncclLibrary(const char** path, const char** source, int* version);

// True if p is device memory (platform/cuda_probe.h: asks a CUDA driver the process has loaded).
bool isDeviceBuffer(const void* p);

}  // namespace lowrank
