// Communicator lifetime: unique id, init, destroy, abort, and the comm's size and rank.
#include <cstddef>
#include <cstring>

#include "api/config.h"
#include "api/errors.h"
#include "api/export.h"
#include "engine/comm_init.h"
#include "util/log.h"

using lowrank::Status;
using lowrank::api::fail;
using lowrank::api::guarded;

LOWRANK_API lowrankResult_t lowrankGetUniqueId(lowrankUniqueId* uniqueId) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!uniqueId) return fail(nullptr, lowrankInvalidArgument, "lowrankGetUniqueId: uniqueId is NULL");
    double timeout;
    Status s = lowrank::api::timeoutFromEnv(&timeout);
    if (s.ok()) s = lowrank::makeUniqueId(uniqueId, timeout);
    return s.ok() ? lowrankSuccess : fail(nullptr, s);
  });
}

LOWRANK_API lowrankResult_t lowrankGetNcclLibrary(const char** path, const char** source,
                                                  int* version) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    const char *p = "", *s = "";
    int v = 0;
    Status st = lowrank::ncclLibrary(&p, &s, &v);
    if (!st.ok()) return fail(nullptr, st);
    if (path) *path = p;
    if (source) *source = s;
    if (version) *version = v;
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitRankConfig(lowrankComm_t* comm, int nranks,
                                                      lowrankUniqueId uniqueId, int rank,
                                                      lowrankConfig_t* config) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitRank: comm is NULL");
    *comm = nullptr;
    if (nranks < 1)
      return fail(nullptr, lowrankInvalidArgument, "lowrankCommInitRank: nranks %d < 1", nranks);
    if (rank < 0 || rank >= nranks)
      return fail(nullptr, lowrankInvalidArgument,
                  "lowrankCommInitRank: rank %d is not in [0, %d)", rank, nranks);
    auto c = std::make_unique<lowrankComm>();
    lowrank::EngineConfig cfg;
    Status s = lowrank::api::resolveConfig(config, &cfg);
    if (s.ok()) s = lowrank::Engine::overUcx(cfg, uniqueId, rank, nranks, &c->engine);
    if (!s.ok()) return fail(nullptr, s);
    lowrank::api::logConfig(cfg, rank, nranks);
    *comm = c.release();
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankCommInitRank(lowrankComm_t* comm, int nranks,
                                                lowrankUniqueId uniqueId, int rank) {
  return lowrankCommInitRankConfig(comm, nranks, uniqueId, rank, nullptr);
}

namespace {

// Destroy and abort: waits for a running call, then frees the comm (Engine::close, which also
// destroys an NCCL communicator the comm owns; abort aborted it already). `fn` names the entry.
lowrankResult_t destroy(lowrankComm_t comm, const char* fn) {
  return guarded(nullptr, [&]() -> lowrankResult_t {
    {
      std::lock_guard<std::mutex> wait(comm->callMu);  // no call may still be running on it
    }
    lowrankStats_t st;
    comm->engine->stats(&st);
    LR_INFO("comm rank %d/%d destroyed: %llu calls, %llu compressed", comm->engine->rank(),
            comm->engine->nranks(), (unsigned long long)st.calls,
            (unsigned long long)st.compressedCalls);
    Status s = lowrank::Engine::close(std::move(comm->engine));
    delete comm;
    if (s.ok()) return lowrankSuccess;
    s.msg = std::string(fn) + ": " + s.msg;
    return fail(nullptr, s);
  });
}

}  // namespace

LOWRANK_API lowrankResult_t lowrankCommDestroy(lowrankComm_t comm) {
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommDestroy: comm is NULL");
  return destroy(comm, "lowrankCommDestroy");
}

LOWRANK_API lowrankResult_t lowrankCommAbort(lowrankComm_t comm) {
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankCommAbort: comm is NULL");
  // Any thread, without the lock: every wait released and an owned NCCL comm aborted first, so a
  // call blocked on the host or the device returns promptly; then destroy waits for it.
  if (lowrankResult_t r = guarded(nullptr, [&]() -> lowrankResult_t {
        comm->engine->abort();
        return lowrankSuccess;
      }))
    return r;
  return destroy(comm, "lowrankCommAbort");
}

LOWRANK_API lowrankResult_t lowrankCommCount(const lowrankComm_t comm, int* count) {
  if (!comm || !count)
    return fail(nullptr, lowrankInvalidArgument, "lowrankCommCount: %s is NULL", comm ? "count" : "comm");
  *count = comm->engine->nranks();
  return lowrankSuccess;
}

LOWRANK_API lowrankResult_t lowrankCommUserRank(const lowrankComm_t comm, int* rank) {
  if (!comm || !rank)
    return fail(nullptr, lowrankInvalidArgument, "lowrankCommUserRank: %s is NULL", comm ? "rank" : "comm");
  *rank = comm->engine->rank();
  return lowrankSuccess;
}

LOWRANK_API lowrankResult_t lowrankCommSetAllocator(lowrankComm_t comm, lowrankAllocFn_t alloc,
                                                    lowrankFreeFn_t free, void* userdata) {
  static const char* fn = "lowrankCommSetAllocator";
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "%s: comm is NULL", fn);
  if (!alloc != !free)
    return fail(comm, lowrankInvalidArgument,
                "%s: %s is NULL and %s is not: give both (or both NULL for lowrank's own "
                "allocation)", fn, alloc ? "free" : "alloc", alloc ? "alloc" : "free");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->setAllocator(lowrank::Allocator{alloc, free, alloc ? userdata : nullptr});
    LR_INFO("device memory of buffers planned from now on: %s", alloc ? "the supplied allocator "
            "(lowrankCommSetAllocator)" : "lowrank's own (cudaMallocAsync)");
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankCommGetConfig(const lowrankComm_t comm, lowrankConfig_t* config) {
  if (!comm || !config)
    return fail(nullptr, lowrankInvalidArgument, "lowrankCommGetConfig: %s is NULL", comm ? "config" : "comm");
  if (!lowrank::api::configSizeKnown(config->size) || config->magic != LOWRANK_CONFIG_MAGIC)
    return fail(nullptr, lowrankInvalidArgument,
                "lowrankCommGetConfig: config not initialized with LOWRANK_CONFIG_INITIALIZER");
  const lowrank::EngineConfig& c = comm->engine->config();
  lowrankConfig_t out = LOWRANK_CONFIG_INITIALIZER;  // written back as far as the caller's size
  out.approxRank = c.approxRank;
  out.minCompressionRate = c.minCompressionRate;
  out.startIter = c.startIter;
  out.errorFeedback = c.errorFeedback;
  out.warmStart = c.warmStart;
  out.orthoEpsilon = c.orthoEpsilon;
  out.seed = (long long)c.seed;
  out.timeoutSec = c.timeoutSec;
  out.pipeline = c.pipeline;
  out.alternate = c.alternate;
  out.factorDtype = int(c.factorDtype);
  const size_t size = config->size;
  std::memcpy(reinterpret_cast<char*>(config) + offsetof(lowrankConfig_t, approxRank),
              reinterpret_cast<const char*>(&out) + offsetof(lowrankConfig_t, approxRank),
              size - offsetof(lowrankConfig_t, approxRank));
  return lowrankSuccess;
}
