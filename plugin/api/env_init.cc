// lowrankCommInitFromEnv: a communicator of one process per comm rank, started by a launcher
// (torchrun, mpirun, srun, by hand), from the launcher's environment variables; no side channel
// for the unique id (see transport/bootstrap/launcher_env.h, reached through engine/comm_init.h).
#include "api/config.h"
#include "api/errors.h"
#include "api/export.h"
#include "engine/comm_init.h"
#include "util/log.h"

using lowrank::Status;
using lowrank::api::fail;
using lowrank::api::guarded;

LOWRANK_API lowrankResult_t lowrankCommInitFromEnvConfig(lowrankComm_t* comm, lowrankConfig_t* config) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitFromEnv: comm is NULL");
    *comm = nullptr;
    lowrank::EngineConfig cfg;  // for the timeout; lowrankCommInitRankConfig resolves it again
    Status s = lowrank::api::resolveConfig(config, &cfg);
    lowrankUniqueId id;
    int rank = -1, size = 0;
    if (s.ok()) s = lowrank::launcherUniqueId(cfg.timeoutSec, &id, &rank, &size);
    if (!s.ok()) return fail(nullptr, s);
    // Every process now holds the same id; comm rank 0 serves it. The rest is lowrankCommInitRank.
    return lowrankCommInitRankConfig(comm, size, id, rank, config);
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitFromEnv(lowrankComm_t* comm) {
  return lowrankCommInitFromEnvConfig(comm, nullptr);
}
