// Comm ranks as processes started by a launcher (torchrun, mpirun, srun, or by hand): each
// process is one comm rank, joined through lowrankCommInitFromEnv. See docs/launching.md.
#pragma once

#include "harness.h"

namespace perf {

// True when the launcher's variables (LOWRANK_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, SLURM_NTASKS: the first one set) say there is more than one process.
bool launchedAsProcesses();

// Runs body as this process's comm rank and returns its exit status. A control communicator
// (exact, from the environment) carries the barriers, the reductions and the unique ids of the
// communicators the body makes.
int runProcess(const RankMain& body);

}  // namespace perf
