// Communicators over NCCL: lowrankCommInitFromNccl (the application's NCCL communicator, not
// owned) and lowrankCommInitNcclRank (one lowrank makes and owns), and NCCL's unique id.
// The real NCCL is resolved at run time (nccl::realNccl); liblowrank links neither NCCL nor CUDA.
#include <cstring>

#include "lowrank/lowrank_nccl.h"

#include "api/config.h"
#include "api/errors.h"
#include "api/export.h"
#include "transport/nccl/nccl_transport.h"
#include "util/log.h"

using lowrank::Status;
using lowrank::api::fail;
using lowrank::api::guarded;
namespace nccl = lowrank::nccl;

static_assert(sizeof(ncclUniqueId) == sizeof(nccl::UniqueId), "ncclUniqueId is 128 bytes");

namespace {

// A communicator being made: freed by lowrank::deleteComm, so that one which already owns its
// NCCL communicator releases it too, whatever way the init fails (an exception included).
struct DeleteComm {
  void operator()(lowrankComm* c) const { (void)lowrank::deleteComm(c); }
};
using CommPtr = std::unique_ptr<lowrankComm, DeleteComm>;

// The first part of both inits, before any NCCL communicator is used: the new comm with its
// configuration resolved, and the real NCCL's table.
Status prepare(const lowrankConfig_t* config, CommPtr* c, const nccl::Api** api) {
  c->reset(new lowrankComm);
  LR_RETURN_IF_ERROR(lowrank::api::resolveConfig(config, &(*c)->cfg));
  return nccl::realNccl(api);
}

// The rest of both inits: c over the NCCL communicator `ncclComm` (owned or not), its NCCL
// transport made; then *comm. On error c is freed (with an owned NCCL communicator).
Status overNccl(const nccl::Api* api, void* ncclComm, bool owned, CommPtr c, lowrankComm_t* comm) {
  c->ncclComm = ncclComm;
  c->ownsNccl = owned;
  std::unique_ptr<lowrank::NcclTransport> t;
  LR_RETURN_IF_ERROR(lowrank::NcclTransport::create(api, ncclComm, c->cfg.timeoutSec, &t));
  c->rank = t->rank();
  c->nranks = t->size();
  c->transport = std::make_unique<lowrank::AsyncTransport>(std::move(t));
  lowrank::api::logConfig(c->cfg, c->rank, c->nranks);
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
    CommPtr c;
    const nccl::Api* api = nullptr;
    Status s = prepare(config, &c, &api);
    if (s.ok()) s = overNccl(api, nccl, /*owned=*/false, std::move(c), comm);
    return s.ok() ? lowrankSuccess : failIn("lowrankCommInitFromNccl", std::move(s));
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitFromNccl(lowrankComm_t* comm, ncclComm_t nccl) {
  return lowrankCommInitFromNcclConfig(comm, nccl, nullptr);
}

LOWRANK_API lowrankResult_t lowrankNcclGetUniqueId(ncclUniqueId* id) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!id) return fail(nullptr, lowrankInvalidArgument, "lowrankNcclGetUniqueId: id is NULL");
    const nccl::Api* api = nullptr;
    Status s = nccl::realNccl(&api);
    if (s.ok()) s = nccl::requireEntry(*api, api->getUniqueId != nullptr, "ncclGetUniqueId");
    if (s.ok())
      s = nccl::fromNccl(*api, api->getUniqueId(reinterpret_cast<nccl::UniqueId*>(id)), "ncclGetUniqueId");
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
    CommPtr c;
    const nccl::Api* api = nullptr;
    Status s = prepare(config, &c, &api);
    if (s.ok()) s = nccl::requireEntry(*api, api->commInitRank != nullptr, "ncclCommInitRank");
    void* ncclComm = nullptr;
    if (s.ok()) {
      nccl::UniqueId uid;
      std::memcpy(&uid, &id, sizeof uid);
      s = nccl::fromNccl(*api, api->commInitRank(&ncclComm, nranks, uid, rank), "ncclCommInitRank");
    }
    // From here the NCCL communicator is c's: freed with it if the rest fails.
    if (s.ok()) s = overNccl(api, ncclComm, /*owned=*/true, std::move(c), comm);
    return s.ok() ? lowrankSuccess : failIn("lowrankCommInitNcclRank", std::move(s));
  });
}
