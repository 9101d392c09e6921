#include "engine/lifecycle.h"

#include <cstdint>

#include "engine/phases.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

Status exactCall(BufferBackend& be, const Call& c, Counters& k) {
  LR_RETURN_IF_ERROR(be.exact(c));
  k.exactElements += c.count;
  k.payloadElements += c.count;
  return Status::Ok();
}

}  // namespace

std::unique_ptr<BackendState> allocateState(BufferBackend& be, const Plan& pl, const Call& c,
                                            const EngineConfig& cfg, int rank,
                                            std::optional<std::string>* refused) {
  const void* buf = c.recv;
  std::string why = "LOWRANK_TEST_FAIL_ALLOC";
  bool byAllocator = false;
  std::unique_ptr<BackendState> state;
  if (cfg.testFailAllocRank != rank) state = be.allocate(pl, c, cfg, &why, &byAllocator);
  if (!state && byAllocator) {
    *refused = why;
    return nullptr;
  }
  if (!state)
    LR_WARN("buffer %p: could not allocate %llu bytes of compression state (%s); it is allreduced "
            "exactly, uncompressed, until it is planned again (lowrankStats_t.exactOnlyPlans)",
            buf, (unsigned long long)be.stateBytes(pl, cfg.errorFeedback), why.c_str());
  return state;
}

Status agreePlan(BufferBackend& be, const Status& s, const Plan& pl, const Call& c, bool allocated,
                 uint64_t restoredId, uint64_t restoredCalls, bool* exactOnly, Counters& k,
                 const std::optional<std::string>& refused) {
  PlanCheck check(s, pl, allocated, restoredId, refused.has_value());
  Status x = be.agree(check.words);
  if (!x.ok() && restoredId)
    // The check met another collective: the peers had the buffer planned and made its call.
    x.msg += "; this comm rank restored the buffer's state (lowrankBufferRestoreState) and so "
             "planned it again, which the other comm ranks did not: restore on every comm rank "
             "at the same point";
  *exactOnly = false;
  if (x.ok() && s.ok()) {
    x = check.read(pl, c.op, c.recv, allocated, restoredId, restoredCalls, exactOnly,
                   refused.has_value());
    if (refused) x.msg += ": " + *refused;
  }
  if (*exactOnly) ++k.exactOnlyPlans;
  if (!s.ok() && !x.ok())
    // This rank's own mistake (a layout set here only, after the other ranks planned) comes first;
    // the plan check then met another collective, which broke the communicator.
    return Status::Error(s.code, "%s; and the plan check with the other comm ranks failed, as they "
                         "did not make it (was the layout set on this rank only?): %s",
                         s.msg.c_str(), x.msg.c_str());
  return s.ok() ? x : s;
}

void logPlanned(const Call& c, const Record& r) {
  LR_INFO("buffer %p planned: count %zu %s, %s, %zu tensors (%zu compressed elements), P %zu Q %zu "
          "exact %zu, %zu P and %zu Q chunks, %llu bytes of state%s",
          c.recv, c.count, dtypeName(c.dtype),
          !r.plan.synthetic ? "tensor ids" : r.plan.perTensor ? "per-tensor" : "batched",
          r.plan.tensors.size(), r.plan.compressedElems, r.plan.pElems, r.plan.qElems,
          r.plan.exactElems, r.plan.pChunks.size(), r.plan.qChunks.size(),
          (unsigned long long)(r.state ? r.state->bytes() : 0), r.exactOnly ? ", exact-only" : "");
}

bool compresses(const EngineConfig& cfg, lowrankDataType_t dtype, lowrankRedOp_t op) {
  return cfg.approxRank > 0 && dtypeCompressible(dtype) && (op == lowrankSum || op == lowrankAvg);
}

Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ) {
  if (!compresses(cfg, c.dtype, c.op)) return exactCall(be, c, k);
  Buffer& b = buffers.get(c.recv);
  // A buffer without ids: a new count, dtype or memory is a new buffer.
  if (b.synthetic && b.rec &&
      (b.rec->plan.count != c.count || b.rec->plan.dtype != c.dtype || b.rec->backend != &be)) {
    LR_INFO("buffer %p: count, dtype or memory (host or device) changed, state reset", c.recv);
    buffers.reset(c.recv, b, k);
  }
  LR_RETURN_IF_ERROR(buffers.take(be, c.recv, b, c, cfg, rank, k));
  Record& r = *b.rec;
  ++r.calls;
  for (uint64_t& n : r.tensorCalls) ++n;
  if (r.plan.compressedElems == 0 || r.exactOnly) return exactCall(be, c, k);

  // This call's checks need room on a device: collect the oldest when every slot is pending.
  uint64_t rejected = 0;
  const Status room = be.collect(*r.state, c.recv, lowrankCudaCollectForRoom, &rejected);
  k.fallbackCalls += rejected;
  if (!room.ok()) {
    buffers.reset(c.recv, b, k);  // its last calls did not finish: the state is not to be trusted
    return room;
  }
  const float* freshQ = nullptr;
  if (!r.haveQ || !cfg.warmStart) {
    scratchQ.resize(r.plan.qElems);
    phases::initialQ(r.plan, cfg, r.tensorCalls.data(), scratchQ.data());
    freshQ = scratchQ.data();
  }
  bool fellBack = false;
  Status s = be.compressed(*r.state, r.plan, c, freshQ, r.plan.alternate && r.qStep, &fellBack);
  if (!s.ok()) {
    buffers.reset(c.recv, b, k);  // never keep a half-updated state (E may hold M)
    return s;
  }
  if (fellBack) {
    LR_INFO("buffer %p: non-finite input on some comm rank; exact allreduce, state reset", c.recv);
    buffers.reset(c.recv, b, k);
    ++k.fallbackCalls;
    return exactCall(be, c, k);
  }
  r.haveQ = true;
  ++k.compressedCalls;
  k.compressedElements += r.plan.compressedElems;
  k.exactElements += r.plan.exactElems;
  if (!r.plan.alternate) {
    k.payloadElements += r.plan.pElems + r.plan.qElems + r.plan.exactElems;
    return Status::Ok();
  }
  k.payloadElements += (r.qStep ? r.plan.qElems : r.plan.pElems) + r.plan.exactElems;
  r.qStep = !r.qStep;
  return Status::Ok();
}

}  // namespace lowrank
