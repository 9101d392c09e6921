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

// Makes the plan of a buffer at its first call and allocates its state, then checks with one
// small allreduce that every comm rank made the same plan and could allocate. Collective, so every
// rank must reach it together. If any rank could not allocate, every rank marks the buffer
// exact-only: the decision is common, so the ranks keep issuing the same collectives.
Status plan(BufferBackend& be, Buffer& b, const Call& c, const EngineConfig& cfg, int rank) {
  Plan pl;
  Status s = makePlan(c.count, c.dtype, c.op, b.layout ? &*b.layout : nullptr, cfg, &pl);
  std::unique_ptr<BackendState> state;
  bool allocated = s.ok() && !pl.compressedElems;  // nothing to compress: no state
  if (s.ok() && pl.compressedElems && cfg.testFailAllocRank != rank) {
    state = be.allocate(pl, c.recv);
    allocated = state != nullptr;
  }
  PlanCheck check(s, pl, allocated);
  Status x = be.agree(check.words);
  bool exactOnly = false;
  if (x.ok() && s.ok()) x = check.read(pl, c.op, c.recv, allocated, &exactOnly);
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
  std::optional<Layout> layout = std::move(b.layout);
  b = Buffer();  // frees the state
  b.layout = std::move(layout);
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
