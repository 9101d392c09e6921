// Communicators over NCCL: lowrankCommInitFromNccl (the application's NCCL communicator, not
// owned) and lowrankCommInitNcclRank (one lowrank makes and owns), and NCCL's unique id.
// The real NCCL is resolved at run time (platform/nccl.h, through engine/comm_init.h); liblowrank
// links neither NCCL nor CUDA.
#include "lowrank/lowrank_nccl.h"

#include "api/config.h"
#include "api/errors.h"
#include "api/export.h"
#include "engine/comm_init.h"
#include "util/log.h"

using lowrank::Status;
using lowrank::api::fail;
using lowrank::api::guarded;

static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes (NCCL_UNIQUE_ID_BYTES)");

namespace {

// The end of both inits: the comm over the NCCL communicator `ncclComm` (owned or not; an owned
// one is released if this fails), then *comm.
Status overNccl(const lowrank::EngineConfig& cfg, void* ncclComm, bool owned, lowrankComm_t* comm) {
  auto c = std::make_unique<lowrankComm>();
  LR_RETURN_IF_ERROR(lowrank::Engine::overNccl(cfg, ncclComm, owned, &c->engine));
  lowrank::api::logConfig(cfg, c->engine->rank(), c->engine->nranks());
  *comm = c.release();
  return Status::Ok();
}

// The error of the entry point `fn`, its message prefixed with fn's name.
lowrankResult_t failIn(const char* fn, Status s) {
  s.msg = std::string(fn) + ": " + s.msg;
  return fail(nullptr, s);
}

}  // namespace

LOWRANK_API lowrankResult_t lowrankCommInitFromNcclConfig(lowrankComm_t* comm, ncclComm_t nccl,
                                                          const lowrankConfig_t* config) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitFromNccl: comm is NULL");
    *comm = nullptr;
    if (!nccl)
      return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitFromNccl: the NCCL communicator is NULL");
    lowrank::EngineConfig cfg;
    Status s = lowrank::api::resolveConfig(config, &cfg);
    if (s.ok()) s = overNccl(cfg, nccl, /*owned=*/false, comm);
    return s.ok() ? lowrankSuccess : failIn("lowrankCommInitFromNccl", std::move(s));
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitFromNccl(lowrankComm_t* comm, ncclComm_t nccl) {
  return lowrankCommInitFromNcclConfig(comm, nccl, nullptr);
}

LOWRANK_API lowrankResult_t lowrankNcclGetUniqueId(ncclUniqueId* id) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!id) return fail(nullptr, lowrankInvalidArgument, "lowrankNcclGetUniqueId: id is NULL");
    Status s = lowrank::ncclUniqueId(id);
    return s.ok() ? lowrankSuccess : failIn("lowrankNcclGetUniqueId", std::move(s));
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitNcclRank(lowrankComm_t* comm, int nranks, ncclUniqueId id,
                                                    int rank, const lowrankConfig_t* config) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitNcclRank: comm is NULL");
    *comm = nullptr;
    if (nranks < 1)
      return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitNcclRank: nranks %d < 1", nranks);
    if (rank < 0 || rank >= nranks)
      return fail(nullptr, lowrankInvalidArgument,
                  "lowrankCommInitNcclRank: rank %d is not in [0, %d)", rank, nranks);
    lowrank::EngineConfig cfg;
    Status s = lowrank::api::resolveConfig(config, &cfg);
    void* ncclComm = nullptr;
    if (s.ok()) s = lowrank::ncclCommInit(&ncclComm, nranks, &id, rank, cfg.timeoutSec);
    // From here the NCCL communicator is the engine's: released by it if the rest fails.
    if (s.ok()) s = overNccl(cfg, ncclComm, /*owned=*/true, comm);
    return s.ok() ? lowrankSuccess : failIn("lowrankCommInitNcclRank", std::move(s));
  });
}
