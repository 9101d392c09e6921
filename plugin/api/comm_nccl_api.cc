// lowrankCommInitFromNccl: a communicator over an application's NCCL communicator (not owned).
// The real NCCL is resolved at run time (nccl::realNccl); liblowrank links neither NCCL nor CUDA.
#include "lowrank/lowrank_nccl.h"

#include "api/config.h"
#include "api/errors.h"
#include "api/export.h"
#include "transport/nccl/nccl_transport.h"
#include "util/log.h"

using lowrank::Status;
using lowrank::api::fail;
using lowrank::api::guarded;

LOWRANK_API lowrankResult_t lowrankCommInitFromNcclConfig(lowrankComm_t* comm, ncclComm_t nccl,
                                                          const lowrankConfig_t* config) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitFromNccl: comm is NULL");
    *comm = nullptr;
    if (!nccl)
      return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitFromNccl: the NCCL communicator is NULL");
    auto c = std::make_unique<lowrankComm>();
    Status s = lowrank::api::resolveConfig(config, &c->cfg);
    const lowrank::nccl::Api* api = nullptr;
    if (s.ok()) s = lowrank::nccl::realNccl(&api);
    std::unique_ptr<lowrank::NcclTransport> t;
    if (s.ok()) s = lowrank::NcclTransport::create(api, nccl, c->cfg.timeoutSec, &t);
    if (!s.ok()) {
      s.msg = "lowrankCommInitFromNccl: " + s.msg;
      return fail(nullptr, s);
    }
    c->rank = t->rank();
    c->nranks = t->size();
    c->ncclComm = nccl;  // not owned: destroy and abort leave it alone
    c->transport = std::make_unique<lowrank::AsyncTransport>(std::move(t));
    lowrank::api::logConfig(c->cfg, c->rank, c->nranks);
    *comm = c.release();
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitFromNccl(lowrankComm_t* comm, ncclComm_t nccl) {
  return lowrankCommInitFromNcclConfig(comm, nccl, nullptr);
}
