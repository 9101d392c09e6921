// State keyed by tensor ids (lowrankBufferSetTensors; docs/design.md, "A tensor's life"): which
// record holds each id's residual, warm-start Q and call count, how a buffer takes its tensors'
// record (its own; another buffer's as is; or a new one with each id's state copied in), warm-up
// per id, and the per-id checkpoint.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "engine/lifecycle.h"
#include "engine/phases.h"
#include "engine/rank_change.h"
#include "util/log.h"

namespace lowrank {
namespace {

// A record's residual and Qt copied to host memory, for the ids taken from it.
struct Snapshot {
  std::vector<float> residual, qt;
};

Status snapshot(const Record& r, bool errorFeedback, Snapshot* out) {
  if (errorFeedback) out->residual.assign(r.plan.count, 0.f);
  out->qt.assign(r.plan.qElems, 0.f);
  if (!r.state) return Status::Ok();
  return r.backend->save(*r.state, r.plan, errorFeedback ? out->residual.data() : nullptr,
                         out->qt.data());
}

// Tensor t of a plan as a saved tensor: its slices of the plan's whole residual and Qt (host
// copies; residual empty without error feedback), the one place a tensor's state is cut out.
SavedTensor sliceOf(const TensorPlan& t, uint64_t id, const Shape& shape, uint64_t calls,
                    bool haveQ, const std::vector<float>& residual, const std::vector<float>& qt) {
  SavedTensor s;
  s.id = id;
  s.shape = shape;
  s.k = t.compressed ? t.k : 0;
  s.calls = calls;
  s.haveQ = t.compressed && haveQ;
  if (!residual.empty())
    s.residual.assign(residual.begin() + long(t.offset), residual.begin() + long(t.offset + t.numel));
  if (s.haveQ)
    s.qt.assign(qt.begin() + long(t.qOffset),
                qt.begin() + long(t.qOffset + size_t(t.k) * t.view.cols));
  return s;
}

// Tensor `index` of record r as a saved tensor, from its snapshot.
SavedTensor savedTensor(const Record& r, size_t index, const Snapshot& snap) {
  const TensorPlan& t = r.plan.tensors[index];
  return sliceOf(t, t.id, r.layout[index], r.tensorCalls[index], r.haveQ && r.state, snap.residual,
                 snap.qt);
}

bool idsFit(const Record& r, const Buffer& b, const Call& c, const BufferBackend& be) {
  return r.decl == b.ids && r.layout == *b.layout && r.plan.count == c.count &&
         r.plan.dtype == c.dtype && r.backend == &be;
}

// The error of a call on a buffer whose id another buffer took since its declaration.
Status movedId(const void* buf, uint64_t id) {
  return Status::Error(lowrankInvalidUsage,
                       "buffer %p: tensor id %llu was taken by another buffer since this buffer "
                       "was declared (lowrankBufferSetTensors): declare it again to take its "
                       "tensors back", buf, (unsigned long long)id);
}

std::string shapeText(const Shape& s) {
  std::string out = "(";
  for (size_t d = 0; d < s.size(); ++d) out += (d ? "," : "") + std::to_string(s[d]);
  return out + ")";
}

}  // namespace

std::unique_ptr<Record> BufferRegistry::detach(Record* r) {
  if (r->holder) {
    auto it = map_.find(r->holder);
    if (it != map_.end() && it->second.rec.get() == r) return std::move(it->second.rec);
  }
  for (auto& p : parked_)
    if (p.get() == r) {
      std::unique_ptr<Record> out = std::move(p);
      p = std::move(parked_.back());
      parked_.pop_back();
      return out;
    }
  return nullptr;
}

void BufferRegistry::drop(std::unique_ptr<Record> r, Counters& k) {
  uint64_t rejected = 0;  // a failed wait counts what arrived; the state goes all the same
  if (r->state) (void)r->backend->collect(*r->state, r->holder, lowrankCudaCollectAll, &rejected);
  k.fallbackCalls += rejected;
  if (r->plan.withIds)
    for (const TensorPlan& t : r->plan.tensors) {
      auto it = owners_.find(t.id);
      if (it != owners_.end() && it->second.rec == r.get()) owners_.erase(it);
    }
  ++generation_;
}  // r freed here (a device state waits for its last call)

void BufferRegistry::dropIfEmpty(Record* r, Counters& k) {
  if (r->held == 0)
    if (std::unique_ptr<Record> gone = detach(r)) drop(std::move(gone), k);
}

void BufferRegistry::disown(const std::vector<uint64_t>& ids, Counters& k) {
  std::vector<Record*> losers;
  for (uint64_t id : ids) {
    pending_.erase(id);
    auto o = owners_.find(id);
    if (o == owners_.end()) continue;
    --o->second.rec->held;
    losers.push_back(o->second.rec);
    owners_.erase(o);
  }
  ++generation_;
  std::sort(losers.begin(), losers.end());
  losers.erase(std::unique(losers.begin(), losers.end()), losers.end());
  for (Record* r : losers) dropIfEmpty(r, k);
}

Status BufferRegistry::takeIds(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
                               const EngineConfig& cfg, int rank, Counters& k) {
  Record* r = b.rec.get();
  if (r && idsFit(*r, b, c, be)) {
    if (r->verified != generation_) {  // an id changed hands, or a restore came, since the check
      const uint64_t* lost = nullptr;
      for (size_t i = 0; i < b.ids.ids.size() && !lost; ++i) {
        auto it = owners_.find(b.ids.ids[i]);
        if (it == owners_.end() || it->second.rec != r || pending_.count(b.ids.ids[i]))
          lost = &b.ids.ids[i];
      }
      // Taken by another record: refused until declared again. Restored, or reset (held by none):
      // planned again here.
      if (lost && !b.declared && !pending_.count(*lost) && owners_.count(*lost))
        return movedId(buf, *lost);
      if (lost) return build(be, buf, b, c, cfg, rank, k);
      r->verified = generation_;
    }
    // Warm-up per id: a tensor planned exact for its warm-up is compressed once it has made
    // startIter calls, which needs a new plan (its state starts then).
    for (size_t i = 0; i < r->cold.size(); ++i)
      if (r->cold[i] && r->tensorCalls[i] >= uint64_t(cfg.startIter))
        return build(be, buf, b, c, cfg, rank, k);
    b.declared = false;
    return Status::Ok();
  }
  if (!b.declared) {  // its record went to another buffer, was dropped by a reset, or no longer
                      // fits the call (another dtype or count: planned again, the state kept)
    for (uint64_t id : b.ids.ids)
      if (auto o = owners_.find(id); o != owners_.end() && o->second.rec != r)
        return movedId(buf, id);
    return build(be, buf, b, c, cfg, rank, k);
  }
  // Declared here: another buffer's record of exactly these tensors moves here as is (FSDP
  // allocates the same parameters' gradients afresh at every step).
  auto o = owners_.find(b.ids.ids[0]);
  if (o != owners_.end()) {
    Record* src = o->second.rec;
    bool whole = src != r && idsFit(*src, b, c, be) && src->held == b.ids.ids.size();
    for (size_t i = 0; whole && i < b.ids.ids.size(); ++i) whole = !pending_.count(b.ids.ids[i]);
    if (whole) {
      std::unique_ptr<Record> moved = detach(src);
      if (b.rec) {  // what this buffer held before stays held for its ids
        b.rec->holder = nullptr;
        b.rec->gaveUp = buf;
        if (b.rec->held) parked_.push_back(std::move(b.rec));
        else drop(std::move(b.rec), k);
      }
      b.rec = std::move(moved);
      b.rec->holder = buf;
      b.rec->verified = generation_;
      b.declared = false;
      return takeIds(be, buf, b, c, cfg, rank, k);  // the warm-up check
    }
  }
  return build(be, buf, b, c, cfg, rank, k);
}

Status BufferRegistry::build(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
                             const EngineConfig& cfg, int rank, Counters& k) {
  const size_t n = b.ids.ids.size();
  // Where each id's state is now: a restore staged for it, a record, or nowhere (fresh).
  std::vector<const SavedTensor*> saved(n, nullptr);
  std::vector<Owner> from(n, Owner{nullptr, 0});
  std::vector<uint64_t> calls(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = b.ids.ids[i];
    if (auto p = pending_.find(id); p != pending_.end()) {
      saved[i] = &p->second;
      calls[i] = p->second.calls;
    } else if (auto o = owners_.find(id); o != owners_.end()) {
      from[i] = o->second;
      calls[i] = o->second.rec->tensorCalls[o->second.index];
    }
  }
  // Warm-up per id: a tensor that has made fewer than startIter calls is planned exact.
  TensorIds inForce = b.ids;
  std::vector<bool> cold(n, false);
  for (size_t i = 0; i < n; ++i)
    if (calls[i] < uint64_t(cfg.startIter) && inForce.ranks[i] != LOWRANK_RANK_EXACT) {
      inForce.ranks[i] = LOWRANK_RANK_EXACT;
      cold[i] = true;
    }
  Plan pl;
  Status s = makePlan(c.count, c.dtype, c.op, &*b.layout, cfg, &pl, &inForce);
  if (!s.ok()) {
    char where[80];
    snprintf(where, sizeof where, "buffer %p (lowrankBufferSetTensors): ", buf);
    s.msg = where + s.msg;
  }
  // An id's shape is the tensor's: state of another shape is another tensor's, never cut to fit.
  for (size_t i = 0; s.ok() && i < n; ++i) {
    const Shape* had = saved[i] ? &saved[i]->shape
                       : from[i].rec ? &from[i].rec->layout[from[i].index] : nullptr;
    if (had && *had != (*b.layout)[i])
      s = Status::Error(lowrankInvalidUsage,
                        "buffer %p: tensor id %llu %s shape %s, the buffer declares %s: an id "
                        "names one tensor (give another tensor another id; %s)",
                        buf, (unsigned long long)b.ids.ids[i],
                        saved[i] ? "was restored with" : "holds state of",
                        shapeText(*had).c_str(), shapeText((*b.layout)[i]).c_str(),
                        saved[i] ? "or drop the restore: lowrankBufferReset of a buffer "
                                   "declaring the id"
                                 : "or drop its state: lowrankBufferReset or Release of the "
                                   "buffer that holds it");
  }
  // The records the ids come from, copied to host memory once each.
  std::unordered_map<const Record*, Snapshot> snaps;
  for (size_t i = 0; s.ok() && i < n; ++i)
    if (from[i].rec && from[i].rec->state && !snaps.count(from[i].rec))
      s = snapshot(*from[i].rec, cfg.errorFeedback, &snaps[from[i].rec]);
  std::unique_ptr<BackendState> state;
  std::optional<std::string> refused;  // the supplied allocator's refusal: the call fails
  bool allocated = s.ok() && !pl.compressedElems;
  bool haveQ = false;
  if (s.ok() && pl.compressedElems) {
    state = allocateState(be, pl, c, cfg, rank, &refused);
    allocated = state != nullptr;
  }
  if (s.ok() && state) {  // each id's residual and Q where the new plan puts them
    std::vector<float> residual(cfg.errorFeedback ? pl.count : 0, 0.f), qt(pl.qElems, 0.f);
    std::vector<bool> gotQ(n, false);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const TensorPlan& t = pl.tensors[i];
      SavedTensor mine;
      const SavedTensor* src = saved[i];
      if (!src && from[i].rec && snaps.count(from[i].rec)) {
        mine = savedTensor(*from[i].rec, from[i].index, snaps[from[i].rec]);
        src = &mine;
      }
      if (!src) continue;
      if (!src->residual.empty() && !residual.empty()) {
        std::copy(src->residual.begin(), src->residual.end(), residual.begin() + long(t.offset));
        any = true;
      }
      // The warm start carries over, at another rank too: its columns kept, cut or grown with
      // fresh ones (rank_change.h).
      if (t.compressed && src->haveQ && src->k > 0 &&
          src->qt.size() == size_t(src->k) * t.view.cols) {
        fitQ(t, cfg, phases::idStream(t.id, calls[i] + 1), src->qt.data(), src->k,
             qt.data() + t.qOffset);
        gotQ[i] = haveQ = true;
      }
    }
    if (haveQ)  // the other tensors' first Q, drawn now as their first call would (host: the same
                // bits; a device orthonormalizes it with its own kernel)
      for (size_t i = 0; i < n; ++i)
        if (pl.tensors[i].compressed && !gotQ[i])
          // Not orthonormalized: the call's warm start does that, as the fresh path would.
          phases::drawNormal(pl.tensors[i], cfg, phases::idStream(pl.tensors[i].id, calls[i] + 1),
                             qt.data() + pl.tensors[i].qOffset);
    if (any || haveQ)
      s = be.load(*state, pl, residual.empty() ? nullptr : residual.data(), qt.data());
  }
  uint64_t restoredId = 0, restoredCalls = 0;
  for (size_t i = 0; i < n; ++i)
    if (saved[i]) {
      restoredId = mix(mix(restoredId ? restoredId : 0x726573746f7265ull, i), agreementId(*saved[i]));
      restoredCalls = saved[i]->calls;
    }
  bool exactOnly = false;
  LR_RETURN_IF_ERROR(
      agreePlan(be, s, pl, c, allocated, restoredId, restoredCalls, &exactOnly, k, refused));

  // Agreed: the new record takes the ids from where they were; a tensor declared with another
  // rank than its record's counts as a change of rank (the same on every comm rank).
  for (size_t i = 0; i < n; ++i)
    if (from[i].rec && declaredRank(from[i].rec->decl.ranks[from[i].index], cfg) !=
                           declaredRank(b.ids.ranks[i], cfg))
      ++k.rankChanges;
  auto r = std::make_unique<Record>();
  r->plan = std::move(pl);
  r->exactOnly = exactOnly;
  r->backend = &be;
  if (!exactOnly) r->state = std::move(state);
  r->haveQ = haveQ && r->state;
  r->layout = *b.layout;
  r->decl = b.ids;
  r->tensorCalls = calls;
  r->cold = cold;
  r->held = n;
  r->holder = buf;
  std::vector<Record*> losers;
  for (size_t i = 0; i < n; ++i) {
    if (from[i].rec) {
      --from[i].rec->held;
      losers.push_back(from[i].rec);
    }
    owners_[b.ids.ids[i]] = Owner{r.get(), i};
    pending_.erase(b.ids.ids[i]);
  }
  if (restoredId) LR_INFO("buffer %p: restored state of its tensor ids installed", buf);
  if (b.rec) {  // what this buffer held before stays held for the ids it still has
    b.rec->holder = nullptr;
    b.rec->gaveUp = buf;
    parked_.push_back(std::move(b.rec));
    losers.push_back(parked_.back().get());
  }
  b.rec = std::move(r);
  ++generation_;
  b.declared = false;
  std::sort(losers.begin(), losers.end());
  losers.erase(std::unique(losers.begin(), losers.end()), losers.end());
  for (Record* l : losers) dropIfEmpty(l, k);
  b.rec->verified = generation_;
  logPlanned(c, *b.rec);
  return Status::Ok();
}

Status BufferRegistry::saveIds(const Buffer& b, const EngineConfig& cfg, int rank, int nranks,
                               SavedTensors* out) const {
  SavedTensors s;
  s.seed = int64_t(cfg.seed);
  s.nranks = nranks;
  s.rank = rank;
  s.errorFeedback = cfg.errorFeedback;
  std::unordered_map<const Record*, Snapshot> snaps;
  for (uint64_t id : b.ids.ids) {
    if (auto p = pending_.find(id); p != pending_.end()) {
      s.tensors.push_back(p->second);
      continue;
    }
    auto o = owners_.find(id);
    if (o == owners_.end()) continue;
    const Record& r = *o->second.rec;
    if (!snaps.count(&r)) LR_RETURN_IF_ERROR(snapshot(r, cfg.errorFeedback, &snaps[&r]));
    s.tensors.push_back(savedTensor(r, o->second.index, snaps[&r]));
  }
  if (s.tensors.empty())
    return Status::Error(lowrankInvalidUsage,
                         "lowrankBufferSaveState: none of the tensor ids declared on this buffer "
                         "has state to save (no compressible call since they were declared, "
                         "reset or released)");
  *out = std::move(s);
  return Status::Ok();
}

void BufferRegistry::stage(SavedTensors s) {
  for (SavedTensor& t : s.tensors) pending_[t.id] = std::move(t);
  ++generation_;
}

Status tensorsOfBuffer(const SavedState& s, const Buffer& b, const EngineConfig& cfg,
                       SavedTensors* out) {
  if (!s.layout || *s.layout != *b.layout)
    return Status::Error(lowrankInvalidUsage,
                         "lowrankBufferRestoreState: state saved for a buffer without tensor ids "
                         "(format 1) restores into a buffer declared with ids only when its "
                         "layout is the one saved");
  Plan pl;  // where the saved buffer kept each tensor's residual and Q
  LR_RETURN_IF_ERROR(makePlan(s.count, s.dtype, lowrankSum, &*s.layout, cfg, &pl));
  if (s.qt.size() != pl.qElems)
    return Status::Error(lowrankInvalidUsage,
                         "lowrankBufferRestoreState: the state holds Q of %zu elements, this "
                         "layout %zu (another min compression rate?)", s.qt.size(), pl.qElems);
  out->seed = s.seed;
  out->nranks = s.nranks;
  out->rank = s.rank;
  out->errorFeedback = s.errorFeedback;
  for (size_t i = 0; i < pl.tensors.size(); ++i)
    out->tensors.push_back(sliceOf(pl.tensors[i], b.ids.ids[i], (*s.layout)[i], s.calls, s.haveQ,
                                   s.residual, s.qt));
  return Status::Ok();
}

}  // namespace lowrank
