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

// A communicator being made: freed by lowrank::deleteComm, so that one which already owns its
// NCCL communicator releases it too, whatever way the init fails (an exception included).
struct DeleteComm {
  void operator()(lowrankComm* c) const { (void)lowrank::deleteComm(c); }
};
using CommPtr = std::unique_ptr<lowrankComm, DeleteComm>;

// The first part of both inits, before any NCCL communicator is used: the new comm with its
// configuration resolved.
Status prepare(const lowrankConfig_t* config, CommPtr* c) {
  c->reset(new lowrankComm);
  return lowrank::api::resolveConfig(config, &(*c)->cfg);
}

// The rest of both inits: c over the NCCL communicator `ncclComm` (owned or not), its NCCL
// transport made; then *comm. On error c is freed (with an owned NCCL communicator).
Status overNccl(void* ncclComm, bool owned, CommPtr c, lowrankComm_t* comm) {
  LR_RETURN_IF_ERROR(lowrank::connectNccl(c.get(), ncclComm, owned));
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
    Status s = prepare(config, &c);
    if (s.ok()) s = overNccl(nccl, /*owned=*/false, std::move(c), comm);
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
    CommPtr c;
    Status s = prepare(config, &c);
    void* ncclComm = nullptr;
    if (s.ok()) s = lowrank::ncclCommInit(&ncclComm, nranks, &id, rank);
    // From here the NCCL communicator is c's: freed with it if the rest fails.
    if (s.ok()) s = overNccl(ncclComm, /*owned=*/true, std::move(c), comm);
    return s.ok() ? lowrankSuccess : failIn("lowrankCommInitNcclRank", std::move(s));
  });
}
