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
            buf, (unsigned long long)pl.stateBytes(cfg.errorFeedback), why.c_str());
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
          r.plan.withIds ? "tensor ids" : r.plan.perTensor ? "per-tensor" : "batched",
          r.plan.tensors.size(), r.plan.compressedElems, r.plan.pElems, r.plan.qElems,
          r.plan.exactElems, r.plan.pChunks.size(), r.plan.qChunks.size(),
          (unsigned long long)(r.state ? r.state->bytes() : 0), r.exactOnly ? ", exact-only" : "");
}

namespace {

// Makes the plan of an anonymous buffer at its first call and allocates its state (with the
// restored state, if any, checked against the plan and loaded into it), then checks with one small
// allreduce that every comm rank made the same plan, restored the same progress and could
// allocate. Collective, so every rank must reach it together. If any rank could not allocate,
// every rank marks the buffer exact-only: the decision is common, so the ranks keep issuing the
// same collectives.
Status plan(BufferBackend& be, Buffer& b, const Call& c, const EngineConfig& cfg, int rank,
            Counters& k) {
  Plan pl;
  Status s = makePlan(c.count, c.dtype, c.op, b.layout ? &*b.layout : nullptr, cfg, &pl);
  const SavedState* saved = b.restored.get();
  if (s.ok() && saved) s = checkPlan(*saved, pl, b.layout, cfg.errorFeedback);
  std::unique_ptr<BackendState> state;
  std::optional<std::string> refused;  // the supplied allocator's refusal
  bool allocated = s.ok() && !pl.compressedElems;  // nothing to compress: no state
  if (s.ok() && pl.compressedElems) {
    state = allocateState(be, pl, c, cfg, rank, &refused);
    allocated = state != nullptr;
    if (state && saved)
      s = be.load(*state, pl, saved->residual.empty() ? nullptr : saved->residual.data(),
                  saved->qt.data());
  }
  bool exactOnly = false;
  LR_RETURN_IF_ERROR(agreePlan(be, s, pl, c, allocated, saved ? agreementId(*saved) : 0,
                               saved ? saved->calls : 0, &exactOnly, k, refused));
  auto r = std::make_unique<Record>();
  r->plan = std::move(pl);
  r->exactOnly = exactOnly;
  r->backend = &be;
  if (!exactOnly) r->state = std::move(state);
  if (saved) {  // go on from the saved call: warm-up, warm start and the next fresh Q's draw
    r->calls = saved->calls;
    r->haveQ = saved->haveQ && r->state;
    LR_INFO("buffer %p: state of call %llu restored%s", c.recv, (unsigned long long)saved->calls,
            r->state ? "" : " (exact-only: its residual and Q are not used)");
    b.restored.reset();
  }
  b.rec = std::move(r);
  logPlanned(c, *b.rec);
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
  (void)buf;
  if (b.rec) drop(std::move(b.rec), k);
  disown(b.ids.ids, k);  // its tensors start afresh, wherever their state was
  b.restored.reset();
  b.declared = false;
}

void BufferRegistry::erase(const void* buf, Counters& k) {
  auto it = map_.find(buf);
  if (it == map_.end()) return;
  // What the buffer holds, and the ids it gave up that no buffer took, go; restores staged for
  // its ids belong to the ids and stay.
  if (it->second.rec) drop(std::move(it->second.rec), k);
  map_.erase(it);
  std::vector<Record*> gaveUp;
  for (const auto& r : parked_)
    if (r->gaveUp == buf) gaveUp.push_back(r.get());
  for (Record* r : gaveUp) drop(detach(r), k);
}

size_t BufferRegistry::held() const {
  size_t n = parked_.size();
  for (const auto& kv : map_) n += kv.second.rec != nullptr;
  return n;
}

uint64_t BufferRegistry::stateBytes() const {
  uint64_t n = 0;
  for (const auto& kv : map_)
    if (kv.second.rec && kv.second.rec->state) n += kv.second.rec->state->bytes();
  for (const auto& r : parked_)
    if (r->state) n += r->state->bytes();
  return n;
}

void BufferRegistry::memory(const void* buf, lowrankMemoryInfo_t* info) const {
  const Buffer* b = find(buf);
  const Record* r = b ? b->rec.get() : nullptr;
  if (!r || !r->state) return;  // holds nothing: every field stays 0
  info->planned = 1;
  r->state->memory(info);
  info->totalBytes = info->residualBytes + info->factorBytes + info->payloadBytes +
                     info->workspaceBytes + info->tableBytes + info->pinnedBytes;
}

void BufferRegistry::collectArrived(const BufferBackend& backend, Counters& k) {
  uint64_t n = 0;  // never waits, so never fails on a wait
  for (auto& kv : map_) {
    Record* r = kv.second.rec.get();
    if (r && r->state && r->backend == &backend)
      if (r->backend->collect(*r->state, kv.first, lowrankCudaCollectArrived, &n).ok())
        k.fallbackCalls += n;
  }
  for (auto& r : parked_)
    if (r->state && r->backend == &backend)
      if (r->backend->collect(*r->state, nullptr, lowrankCudaCollectArrived, &n).ok())
        k.fallbackCalls += n;
}

Status saveBuffer(const Buffer& b, const EngineConfig& cfg, int rank, int nranks, SavedState* out) {
  if (b.restored) {
    *out = *b.restored;
    return Status::Ok();
  }
  const Record& r = *b.rec;
  SavedState s;
  s.count = r.plan.count;
  s.dtype = r.plan.dtype;
  if (r.plan.perTensor) s.layout = b.layout;
  s.approxRank = cfg.approxRank;
  s.seed = cfg.seed;
  s.nranks = nranks;
  s.rank = rank;
  s.errorFeedback = cfg.errorFeedback;
  s.calls = r.calls;
  s.haveQ = r.haveQ && r.state;
  // Sizes fixed by the plan whatever the progress (the size a NULL save reports stays right); an
  // exact-only buffer, or one with nothing compressed, saves zeros.
  if (s.errorFeedback) s.residual.assign(r.plan.count, 0.f);
  s.qt.assign(r.plan.qElems, 0.f);
  if (r.state)
    LR_RETURN_IF_ERROR(r.backend->save(*r.state, r.plan, s.errorFeedback ? s.residual.data() : nullptr,
                                       s.qt.data()));
  *out = std::move(s);
  return Status::Ok();
}

Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ) {
  if (!compresses(cfg, c.dtype, c.op)) return exactCall(be, c, k);
  Buffer& b = buffers.get(c.recv);
  if (!b.ids.ids.empty()) {  // tensors with ids: their record, wherever it was
    LR_RETURN_IF_ERROR(buffers.takeIds(be, c.recv, b, c, cfg, rank, k));
  } else {
    if (b.rec && (b.rec->plan.count != c.count || b.rec->plan.dtype != c.dtype ||
                  b.rec->backend != &be)) {
      LR_INFO("buffer %p: count, dtype or memory (host or device) changed, state reset", c.recv);
      buffers.reset(c.recv, b, k);
    }
    if (!b.rec) LR_RETURN_IF_ERROR(plan(be, b, c, cfg, rank, k));
  }
  Record& r = *b.rec;
  // Warm-up: an anonymous buffer counts its calls here; tensors with ids were planned exact
  // while in theirs (takeIds).
  const bool warmup = !r.plan.withIds && r.calls < uint64_t(cfg.startIter);
  ++r.calls;
  for (uint64_t& n : r.tensorCalls) ++n;
  if (r.plan.compressedElems == 0 || warmup || r.exactOnly) return exactCall(be, c, k);

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
    phases::initialQ(r.plan, cfg, r.calls, scratchQ.data(),
                     r.plan.withIds ? r.tensorCalls.data() : nullptr);
    freshQ = scratchQ.data();
  }
  bool fellBack = false;
  Status s = be.compressed(*r.state, r.plan, c, freshQ, &fellBack);
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
  k.payloadElements += r.plan.pElems + r.plan.qElems + r.plan.exactElems;
  return Status::Ok();
}

}  // namespace lowrank
