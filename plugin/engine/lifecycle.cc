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

// Makes the plan of a buffer at its first call and allocates its state (with the restored state,
// if any, checked against the plan and loaded into it), then checks with one small allreduce that
// every comm rank made the same plan, restored the same progress and could allocate. Collective,
// so every rank must reach it together. If any rank could not allocate, every rank marks the
// buffer exact-only: the decision is common, so the ranks keep issuing the same collectives.
Status plan(BufferBackend& be, Buffer& b, const Call& c, const EngineConfig& cfg, int rank) {
  Plan pl;
  Status s = makePlan(c.count, c.dtype, c.op, b.layout ? &*b.layout : nullptr, cfg, &pl);
  const SavedState* saved = b.restored.get();
  if (s.ok() && saved) s = checkPlan(*saved, pl, b.layout, cfg.errorFeedback);
  std::unique_ptr<BackendState> state;
  bool allocated = s.ok() && !pl.compressedElems;  // nothing to compress: no state
  if (s.ok() && pl.compressedElems && cfg.testFailAllocRank != rank) {
    state = be.allocate(pl, c.recv);
    allocated = state != nullptr;
    if (state && saved)
      s = be.load(*state, pl, saved->residual.empty() ? nullptr : saved->residual.data(),
                  saved->qt.data());
  }
  const uint64_t restoredId = saved ? agreementId(*saved) : 0;
  PlanCheck check(s, pl, allocated, restoredId);
  Status x = be.agree(check.words);
  if (!x.ok() && saved)
    // The check met another collective: the peers had the buffer planned and made its call.
    x.msg += "; this comm rank restored the buffer's state (lowrankBufferRestoreState) and so "
             "planned it again, which the other comm ranks did not: restore on every comm rank "
             "at the same point";
  bool exactOnly = false;
  if (x.ok() && s.ok())
    x = check.read(pl, c.op, c.recv, allocated, restoredId, saved ? saved->calls : 0, &exactOnly);
  if (!s.ok() && !x.ok())
    // This rank's own mistake (a layout set here only, after the other ranks planned) comes first;
    // the plan check then met another collective, which broke the communicator.
    return Status::Error(s.code, "%s; and the plan check with the other comm ranks failed, as they "
                         "did not make it (was the layout set on this rank only?): %s",
                         s.msg.c_str(), x.msg.c_str());
  if (!s.ok()) return s;
  if (!x.ok()) return x;
  b.plan = std::move(pl);
  b.planned = true;
  b.exactOnly = exactOnly;
  b.backend = &be;
  if (!exactOnly) b.state = std::move(state);
  if (saved) {  // go on from the saved call: warm-up, warm start and the next fresh Q's draw
    b.calls = saved->calls;
    b.haveQ = saved->haveQ && b.state;
    LR_INFO("buffer %p: state of call %llu restored%s", c.recv, (unsigned long long)saved->calls,
            b.state ? "" : " (exact-only: its residual and Q are not used)");
    b.restored.reset();
  }
  LR_INFO("buffer %p planned: count %zu %s, %s, %zu tensors (%zu compressed elements), P %zu Q %zu "
          "exact %zu, %zu P and %zu Q chunks, %llu bytes of state%s",
          c.recv, c.count, dtypeName(c.dtype), b.plan.perTensor ? "per-tensor" : "batched",
          b.plan.tensors.size(), b.plan.compressedElems, b.plan.pElems, b.plan.qElems,
          b.plan.exactElems, b.plan.pChunks.size(), b.plan.qChunks.size(),
          (unsigned long long)(b.state ? b.state->bytes() : 0), exactOnly ? ", exact-only" : "");
  return Status::Ok();
}

}  // namespace

bool compresses(const EngineConfig& cfg, lowrankDataType_t dtype, lowrankRedOp_t op) {
  return cfg.approxRank > 0 && dtypeCompressible(dtype) && (op == lowrankSum || op == lowrankAvg);
}

Buffer* BufferRegistry::find(const void* buf) {
  auto it = map_.find(buf);
  return it == map_.end() ? nullptr : &it->second;
}

const Buffer* BufferRegistry::find(const void* buf) const {
  auto it = map_.find(buf);
  return it == map_.end() ? nullptr : &it->second;
}

void BufferRegistry::reset(const void* buf, Buffer& b, Counters& k) {
  if (b.state) k.fallbackCalls += b.backend->collect(*b.state, buf, lowrankCudaCollectAll);
  Buffer fresh;  // everything but the layout: plan, state, progress, a pending restore
  fresh.layout.swap(b.layout);
  b = std::move(fresh);  // frees the state
}

void BufferRegistry::erase(const void* buf, Counters& k) {
  auto it = map_.find(buf);
  if (it == map_.end()) return;
  reset(buf, it->second, k);
  map_.erase(it);
}

uint64_t BufferRegistry::stateBytes() const {
  uint64_t n = 0;
  for (const auto& kv : map_)
    if (kv.second.state) n += kv.second.state->bytes();
  return n;
}

void BufferRegistry::collectArrived(const BufferBackend& backend, Counters& k) {
  for (auto& kv : map_)
    if (kv.second.state && kv.second.backend == &backend)
      k.fallbackCalls += kv.second.backend->collect(*kv.second.state, kv.first, lowrankCudaCollectArrived);
}

Status saveBuffer(const Buffer& b, const EngineConfig& cfg, int rank, int nranks, SavedState* out) {
  if (b.restored) {
    *out = *b.restored;
    return Status::Ok();
  }
  SavedState s;
  s.count = b.plan.count;
  s.dtype = b.plan.dtype;
  if (b.plan.perTensor) s.layout = b.layout;
  s.approxRank = cfg.approxRank;
  s.seed = cfg.seed;
  s.nranks = nranks;
  s.rank = rank;
  s.errorFeedback = cfg.errorFeedback;
  s.calls = b.calls;
  s.haveQ = b.haveQ && b.state;
  // Sizes fixed by the plan whatever the progress (the size a NULL save reports stays right); an
  // exact-only buffer, or one with nothing compressed, saves zeros.
  if (s.errorFeedback) s.residual.assign(b.plan.count, 0.f);
  s.qt.assign(b.plan.qElems, 0.f);
  if (b.state)
    LR_RETURN_IF_ERROR(b.backend->save(*b.state, b.plan, s.errorFeedback ? s.residual.data() : nullptr,
                                       s.qt.data()));
  *out = std::move(s);
  return Status::Ok();
}

Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ) {
  if (!compresses(cfg, c.dtype, c.op)) return exactCall(be, c, k);
  Buffer& b = buffers.get(c.recv);
  if (b.planned && (b.plan.count != c.count || b.plan.dtype != c.dtype || b.backend != &be)) {
    LR_INFO("buffer %p: count, dtype or memory (host or device) changed, state reset", c.recv);
    buffers.reset(c.recv, b, k);
  }
  if (!b.planned) LR_RETURN_IF_ERROR(plan(be, b, c, cfg, rank));
  const bool warmup = b.calls < uint64_t(cfg.startIter);
  ++b.calls;
  if (b.plan.compressedElems == 0 || warmup || b.exactOnly) return exactCall(be, c, k);

  // This call's checks need room on a device: collect the oldest when every slot is pending.
  k.fallbackCalls += be.collect(*b.state, c.recv, lowrankCudaCollectForRoom);
  const float* freshQ = nullptr;
  if (!b.haveQ || !cfg.warmStart) {
    scratchQ.resize(b.plan.qElems);
    phases::initialQ(b.plan, cfg, b.calls, scratchQ.data());
    freshQ = scratchQ.data();
  }
  bool fellBack = false;
  Status s = be.compressed(*b.state, b.plan, c, freshQ, &fellBack);
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
  b.haveQ = true;
  ++k.compressedCalls;
  k.compressedElements += b.plan.compressedElems;
  k.exactElements += b.plan.exactElems;
  k.payloadElements += b.plan.pElems + b.plan.qElems + b.plan.exactElems;
  return Status::Ok();
}

}  // namespace lowrank
