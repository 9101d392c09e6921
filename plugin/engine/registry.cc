// The registry of a communicator's buffers and their tensors' state (registry.h; docs/design.md,
// "A tensor's life"): which record holds each id's residual, warm-start Q and call count, how a
// buffer takes its tensors' record (its own; another buffer's as is; or a new one with each id's
// state copied in), warm-up per id, and the per-id checkpoint.
#include "engine/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "engine/lifecycle.h"
#include "engine/phases.h"
#include "engine/rank_change.h"
#include "util/log.h"

namespace lowrank {
namespace {

// A record's residual, Qt and (before an alternating Q step) kept P copied to host memory, for
// the ids taken from it.
struct Snapshot {
  std::vector<float> residual, qt, p;
};

bool keepsP(const Record& r) { return r.plan.alternate && r.qStep && r.haveQ && r.state; }

Status snapshot(const Record& r, bool errorFeedback, Snapshot* out) {
  if (errorFeedback) out->residual.assign(r.plan.count, 0.f);
  out->qt.assign(r.plan.qElems, 0.f);
  if (keepsP(r)) out->p.assign(r.plan.pElems, 0.f);
  if (!r.state) return Status::Ok();
  return r.backend->save(*r.state, r.plan, errorFeedback ? out->residual.data() : nullptr,
                         out->qt.data(), out->p.empty() ? nullptr : out->p.data());
}

// Tensor `index` of record r as a saved tensor, from its snapshot.
SavedTensor savedTensor(const Record& r, size_t index, const Snapshot& snap) {
  return sliceOf(r.plan.tensors[index], r.decl.ids[index], r.shapes[index], r.tensorCalls[index],
                 r.haveQ && r.state, snap.residual, snap.qt, keepsP(r), snap.p);
}

// True when the shapes are b's tensors' for a call of count elements (Buffer::shapes, uncopied).
bool sameShapes(const Layout& shapes, const Buffer& b, size_t count) {
  if (b.layout) return shapes == *b.layout;
  return shapes.size() == 1 && shapes[0].size() == 1 && shapes[0][0] == count;
}

bool idsFit(const Record& r, const Buffer& b, const Call& c, const BufferBackend& be,
            const EngineConfig& cfg) {
  return r.decl == b.ids && sameShapes(r.shapes, b, c.count) && r.plan.count == c.count &&
         r.plan.dtype == c.dtype && r.backend == &be && r.plan.alternate == b.alternates(cfg);
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
  for (size_t d = 0; d < s.size(); ++d) {
    if (d) out += ',';
    out += std::to_string(s[d]);
  }
  return out + ")";
}

}  // namespace

Buffer* BufferRegistry::find(const void* buf) {
  auto it = map_.find(buf);
  return it == map_.end() ? nullptr : &it->second;
}

const Buffer* BufferRegistry::find(const void* buf) const {
  auto it = map_.find(buf);
  return it == map_.end() ? nullptr : &it->second;
}

void BufferRegistry::reset(const void* buf, Buffer& b, Counters& k, bool keepRestores) {
  if (b.rec) drop(std::move(b.rec), k);
  disown(space(buf, b), b.ids.ids, k, keepRestores);  // its tensors start afresh, wherever held
  b.declared = false;
}

void BufferRegistry::erase(const void* buf, Counters& k) {
  auto it = map_.find(buf);
  if (it == map_.end()) return;
  // What the buffer holds, its own key space, and the ids it gave up that no buffer took, go;
  // restores staged for caller ids belong to the ids and stay.
  if (it->second.rec) drop(std::move(it->second.rec), k);
  if (it->second.synthetic) disown(buf, {}, k);
  map_.erase(it);
  std::vector<Record*> gaveUp;
  for (const auto& r : parked_)
    if (r->lastHeldBy == buf) gaveUp.push_back(r.get());
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

std::unique_ptr<Record> BufferRegistry::detach(Record* r) {
  if (r->heldBy) {
    auto it = map_.find(r->heldBy);
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
  if (r->state) (void)r->backend->collect(*r->state, r->heldBy, lowrankCudaCollectAll, &rejected);
  k.fallbackCalls += rejected;
  for (uint64_t id : r->decl.ids) {
    auto it = owners_.find(TensorKey{r->space, id});
    if (it != owners_.end() && it->second.rec == r.get()) owners_.erase(it);
  }
  ++generation_;
}  // r freed here (a device state waits for its last call)

void BufferRegistry::dropIfEmpty(Record* r, Counters& k) {
  if (r->idsHeld == 0)
    if (std::unique_ptr<Record> gone = detach(r)) drop(std::move(gone), k);
}

void BufferRegistry::disown(const void* space, const std::vector<uint64_t>& ids, Counters& k,
                            bool keepRestores) {
  if (space && !keepRestores)  // a buffer's own key space: every restore staged in it
    for (auto it = pending_.begin(); it != pending_.end();)
      it = it->first.space == space ? pending_.erase(it) : std::next(it);
  std::vector<Record*> losers;
  for (uint64_t id : ids) {
    if (!keepRestores) pending_.erase(TensorKey{space, id});
    auto o = owners_.find(TensorKey{space, id});
    if (o == owners_.end()) continue;
    --o->second.rec->idsHeld;
    losers.push_back(o->second.rec);
    owners_.erase(o);
  }
  ++generation_;
  std::sort(losers.begin(), losers.end());
  losers.erase(std::unique(losers.begin(), losers.end()), losers.end());
  for (Record* r : losers) dropIfEmpty(r, k);
}

Status BufferRegistry::take(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
                            const EngineConfig& cfg, int rank, Counters& k) {
  const void* sp = space(buf, b);
  Record* r = b.rec.get();
  if (r && idsFit(*r, b, c, be, cfg)) {
    if (r->checkedAt != generation_) {  // an id changed hands, or a restore came, since the check
      const uint64_t* lost = nullptr;
      for (size_t i = 0; i < b.ids.ids.size() && !lost; ++i) {
        const TensorKey key{sp, b.ids.ids[i]};
        auto it = owners_.find(key);
        if (it == owners_.end() || it->second.rec != r || pending_.count(key)) lost = &b.ids.ids[i];
      }
      // Taken by another record: refused until declared again. Restored, or reset (held by none):
      // planned again here.
      if (lost && !b.declared && !pending_.count({sp, *lost}) && owners_.count({sp, *lost}))
        return movedId(buf, *lost);
      if (lost) return build(be, buf, b, c, cfg, rank, k);
      r->checkedAt = generation_;
    }
    // Warm-up per id: a tensor planned exact for its warm-up is compressed once it has made
    // startIter calls, which needs a new plan (its state starts then).
    for (size_t i = 0; i < r->inWarmup.size(); ++i)
      if (r->inWarmup[i] && r->tensorCalls[i] >= uint64_t(cfg.startIter))
        return build(be, buf, b, c, cfg, rank, k);
    b.declared = false;
    return Status::Ok();
  }
  if (!b.declared) {  // its record went to another buffer, was dropped by a reset, or no longer
                      // fits the call (another dtype or count: planned again, the state kept)
    for (uint64_t id : b.ids.ids)
      if (auto o = owners_.find({sp, id}); o != owners_.end() && o->second.rec != r)
        return movedId(buf, id);
    return build(be, buf, b, c, cfg, rank, k);
  }
  // Declared here: another buffer's record of exactly these tensors moves here as is (FSDP
  // allocates the same parameters' gradients afresh at every step).
  auto o = owners_.find({sp, b.ids.ids[0]});
  if (o != owners_.end()) {
    Record* src = o->second.rec;
    bool whole = src != r && idsFit(*src, b, c, be, cfg) && src->idsHeld == b.ids.ids.size();
    for (size_t i = 0; whole && i < b.ids.ids.size(); ++i) whole = !pending_.count({sp, b.ids.ids[i]});
    if (whole) {
      std::unique_ptr<Record> moved = detach(src);
      if (b.rec) {  // what this buffer held before stays held for its ids
        b.rec->heldBy = nullptr;
        b.rec->lastHeldBy = buf;
        if (b.rec->idsHeld) parked_.push_back(std::move(b.rec));
        else drop(std::move(b.rec), k);
      }
      b.rec = std::move(moved);
      b.rec->heldBy = buf;
      b.rec->checkedAt = generation_;
      b.declared = false;
      return take(be, buf, b, c, cfg, rank, k);  // the warm-up check
    }
  }
  return build(be, buf, b, c, cfg, rank, k);
}

Status BufferRegistry::build(BufferBackend& be, const void* buf, Buffer& b, const Call& c,
                             const EngineConfig& cfg, int rank, Counters& k) {
  const void* sp = space(buf, b);
  const size_t n = b.ids.ids.size();
  const Layout shapes = b.shapes(c.count);
  // Where each id's state is now: a restore staged for it, a record, or nowhere (fresh).
  std::vector<const SavedTensor*> saved(n, nullptr);
  std::vector<Owner> from(n, Owner{nullptr, 0});
  std::vector<uint64_t> calls(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const TensorKey key{sp, b.ids.ids[i]};
    if (auto p = pending_.find(key); p != pending_.end()) {
      saved[i] = &p->second;
      calls[i] = p->second.calls;
    } else if (auto o = owners_.find(key); o != owners_.end()) {
      from[i] = o->second;
      calls[i] = o->second.rec->tensorCalls[o->second.index];
    }
  }
  // Warm-up per id: a tensor that has made fewer than startIter calls is planned exact.
  TensorIds inForce = b.ids;
  std::vector<bool> inWarmup(n, false);
  for (size_t i = 0; i < n; ++i)
    if (calls[i] < uint64_t(cfg.startIter) && inForce.ranks[i] != LOWRANK_RANK_EXACT) {
      inForce.ranks[i] = LOWRANK_RANK_EXACT;
      inWarmup[i] = true;
    }
  Plan pl;
  Status s = makePlan(c.count, c.dtype, c.op, b.layout ? &*b.layout : nullptr, cfg, &pl, &inForce);
  pl.synthetic = b.synthetic;
  pl.alternate = b.alternates(cfg);
  if (!s.ok()) {
    char where[80];
    snprintf(where, sizeof where, "buffer %p%s: ", buf,
             b.synthetic ? "" : " (lowrankBufferSetTensors)");
    s.msg = where + s.msg;
  }
  // An id's shape is the tensor's: state of another shape is another tensor's, never cut to fit.
  for (size_t i = 0; s.ok() && i < n; ++i) {
    const Shape* had = saved[i] ? &saved[i]->shape
                       : from[i].rec ? &from[i].rec->shapes[from[i].index] : nullptr;
    if (had && *had != shapes[i])
      s = Status::Error(lowrankInvalidUsage,
                        "buffer %p: %s %llu %s shape %s, the buffer %s %s: %s", buf,
                        b.synthetic ? "the tensor at position" : "tensor id",
                        (unsigned long long)b.ids.ids[i],
                        saved[i] ? "was restored with" : "holds state of",
                        shapeText(*had).c_str(), b.synthetic ? "has" : "declares",
                        shapeText(shapes[i]).c_str(),
                        b.synthetic ? "restore into a buffer of the layout saved, or drop the "
                                      "restore (lowrankBufferReset)"
                        : saved[i] ? "an id names one tensor (give another tensor another id; or "
                                     "drop the restore: lowrankBufferReset of a buffer declaring "
                                     "the id)"
                                   : "an id names one tensor (give another tensor another id; or "
                                     "drop its state: lowrankBufferReset or Release of the buffer "
                                     "that holds it)");
  }
  // The records the ids come from, copied to host memory once each.
  std::unordered_map<const Record*, Snapshot> snaps;
  for (size_t i = 0; s.ok() && i < n; ++i)
    if (from[i].rec && from[i].rec->state && !snaps.count(from[i].rec))
      s = snapshot(*from[i].rec, cfg.errorFeedback, &snaps[from[i].rec]);
  std::unique_ptr<BackendState> state;
  std::optional<std::string> refused;  // the supplied allocator's refusal: the call fails
  bool allocated = s.ok() && !pl.compressedElems;
  bool haveQ = false, qStep = false;
  if (s.ok() && pl.compressedElems) {
    state = allocateState(be, pl, c, cfg, rank, &refused);
    allocated = state != nullptr;
  }
  // Each id's residual and Q where the new plan puts them, through host memory: only when some id
  // has state to carry (a fresh plan's, or one after the warm-up, is the backend's zeroed state;
  // a full-size host copy would cost a buffer's worth of page faults at every plan).
  const bool carried = std::any_of(saved.begin(), saved.end(), [](auto* p) { return p; }) ||
                       std::any_of(from.begin(), from.end(), [](const Owner& o) { return o.rec && o.rec->state; });
  if (s.ok() && state && carried) {
    std::vector<float> residual(cfg.errorFeedback ? pl.count : 0, 0.f), qt(pl.qElems, 0.f);
    std::vector<float> p(pl.alternate ? pl.pElems : 0, 0.f);
    std::vector<bool> gotQ(n, false);
    // Alternating: the record goes on with a Q step only if every compressed tensor was about to
    // make one at this k (its kept P comes along); else the alternation restarts with a P step.
    qStep = pl.alternate;
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
        fitQ(t, cfg, phases::qStream(pl, i, calls[i] + 1), src->qt.data(), src->k,
             qt.data() + t.qOffset);
        gotQ[i] = haveQ = true;
      }
      if (t.compressed && qStep && src->qStep && src->k == t.k && gotQ[i] &&
          src->p.size() == size_t(t.k) * t.view.rows)
        std::copy(src->p.begin(), src->p.end(), p.begin() + long(t.pOffset));
      else if (t.compressed)
        qStep = false;
    }
    for (size_t i = 0; qStep && i < n; ++i)  // a compressed tensor with no state at all
      if (pl.tensors[i].compressed && !gotQ[i]) qStep = false;
    if (haveQ)  // the other tensors' first Q, drawn now as their first call would (host: the same
                // bits; a device orthonormalizes it with its own kernel)
      for (size_t i = 0; i < n; ++i)
        if (pl.tensors[i].compressed && !gotQ[i])
          // Not orthonormalized: the call's warm start does that, as the fresh path would.
          phases::drawNormal(pl.tensors[i], cfg, phases::qStream(pl, i, calls[i] + 1),
                             qt.data() + pl.tensors[i].qOffset);
    if (any || haveQ)
      s = be.load(*state, pl, residual.empty() ? nullptr : residual.data(), qt.data(),
                  qStep ? p.data() : nullptr);
  }
  // The phase is part of what every comm rank must agree on (ranks at different steps fail).
  if (pl.alternate) pl.hash = mix(pl.hash, qStep ? 0x5173746570ull : 0x5073746570ull);
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
  // A buffer without ids counts its calls from its first (lowrankBufferView_t.calls), as it did
  // before its warm-up or restore re-planned it; a declaration from its plan.
  r->calls = b.synthetic && n ? calls[0] : 0;
  r->exactOnly = exactOnly;
  r->backend = &be;
  if (!exactOnly) r->state = std::move(state);
  r->haveQ = haveQ && r->state;
  r->qStep = qStep && r->haveQ;
  r->space = sp;
  r->shapes = shapes;
  r->decl = b.ids;
  r->tensorCalls = calls;
  r->inWarmup = inWarmup;
  r->idsHeld = n;
  r->heldBy = buf;
  std::vector<Record*> losers;
  for (size_t i = 0; i < n; ++i) {  // each id leaves its holder, the one its state came from or
    const TensorKey key{sp, b.ids.ids[i]};  // one a restore replaced
    if (auto o = owners_.find(key); o != owners_.end()) {
      --o->second.rec->idsHeld;
      losers.push_back(o->second.rec);
    }
    owners_[key] = Owner{r.get(), i};
    pending_.erase(key);
  }
  if (restoredId) LR_INFO("buffer %p: restored state of call %llu installed", buf,
                          (unsigned long long)restoredCalls);
  if (b.rec) {  // what this buffer held before stays held for the ids it still has
    b.rec->heldBy = nullptr;
    b.rec->lastHeldBy = buf;
    parked_.push_back(std::move(b.rec));
    losers.push_back(parked_.back().get());
  }
  b.rec = std::move(r);
  ++generation_;
  b.declared = false;
  std::sort(losers.begin(), losers.end());
  losers.erase(std::unique(losers.begin(), losers.end()), losers.end());
  for (Record* l : losers) dropIfEmpty(l, k);
  b.rec->checkedAt = generation_;
  logPlanned(c, *b.rec);
  return Status::Ok();
}

Status BufferRegistry::save(const void* buf, const Buffer& b, const EngineConfig& cfg, int rank,
                            int nranks, SavedTensors* out) const {
  SavedTensors s;
  s.seed = int64_t(cfg.seed);
  s.nranks = nranks;
  s.rank = rank;
  s.errorFeedback = cfg.errorFeedback;
  s.byPosition = b.synthetic;
  const void* sp = space(buf, b);
  std::vector<uint64_t> ids = b.ids.ids;
  if (b.synthetic) {  // positions, and those of a restore staged before the layout was set
    uint64_t count = ids.size();
    for (const auto& kv : pending_)
      if (kv.first.space == sp) count = std::max(count, kv.first.id + 1);
    for (uint64_t i = ids.size(); i < count; ++i) ids.push_back(i);
  }
  std::unordered_map<const Record*, Snapshot> snaps;
  for (uint64_t id : ids) {
    if (auto p = pending_.find({sp, id}); p != pending_.end()) {
      s.tensors.push_back(p->second);
      continue;
    }
    auto o = owners_.find({sp, id});
    if (o == owners_.end()) continue;
    const Record& r = *o->second.rec;
    if (!snaps.count(&r)) LR_RETURN_IF_ERROR(snapshot(r, cfg.errorFeedback, &snaps[&r]));
    s.tensors.push_back(savedTensor(r, o->second.index, snaps[&r]));
  }
  if (s.tensors.empty())
    return Status::Error(lowrankInvalidUsage, b.synthetic
        ? "lowrankBufferSaveState: buffer %p has no state to save (no compressible call on this "
          "communicator since it was made, reset or released, or since a call fell back to exact "
          "on non-finite input)"
        : "lowrankBufferSaveState: none of the tensor ids declared on buffer %p has state to save "
          "(no compressible call since they were declared, reset or released)", buf);
  *out = std::move(s);
  return Status::Ok();
}

void BufferRegistry::stage(const void* space, SavedTensors s) {
  for (SavedTensor& t : s.tensors) pending_[TensorKey{space, t.id}] = std::move(t);
  ++generation_;
}

TensorIds positions(size_t n) {
  TensorIds t;
  for (size_t i = 0; i < n; ++i) t.ids.push_back(i);
  t.ranks.assign(n, LOWRANK_RANK_DEFAULT);
  return t;
}

Status byPosition(SavedTensors s, const Buffer& b, SavedTensors* out) {
  if (!b.synthetic) {  // each position becomes the declared id there, tensor by tensor
    bool fits = s.tensors.size() == b.ids.ids.size();
    for (size_t i = 0; fits && i < s.tensors.size(); ++i)
      fits = s.tensors[i].id == i && s.tensors[i].shape == (*b.layout)[i];
    if (!fits)
      return Status::Error(lowrankInvalidUsage,
                           "a state saved for a buffer without tensor ids goes to a buffer declared "
                           "with ids only when its layout is the one saved");
    for (size_t i = 0; i < s.tensors.size(); ++i) s.tensors[i].id = b.ids.ids[i];
    s.byPosition = false;
  }
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace lowrank
