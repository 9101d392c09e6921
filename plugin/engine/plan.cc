#include "engine/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

size_t isqrtCeil(size_t x) {
  size_t s = size_t(std::sqrt(double(x)));
  while (s * s < x) ++s;
  while (s > 0 && (s - 1) * (s - 1) >= x) --s;
  return s;
}

// k: the approximation rank asked for the tensor (0: exact).
void addCompressed(Plan& p, TensorPlan t, const EngineConfig& cfg, int k) {
  t.k = int(std::min<size_t>({size_t(k), t.view.rows, t.view.cols}));
  t.compressed = k > 0 &&
                 shouldCompress(t.view.rows, t.view.cols, t.k, cfg.minCompressionRate);
  if (t.compressed) {
    t.pOffset = p.pElems;
    t.qOffset = p.qElems;
    p.pElems += t.view.rows * size_t(t.k);
    p.qElems += t.view.cols * size_t(t.k);
    p.compressedElems += t.numel;
  } else {
    t.exactOffset = p.exactElems;
    p.exactElems += t.numel;
  }
  p.tensors.push_back(t);
}

constexpr size_t kMinColBlock = 512;

}  // namespace

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

// Splits every compressed tensor into row blocks (P) and column blocks (Q) of at most `target`
// elements of M, and groups consecutive blocks into chunks of about `target` elements.
void makeChunks(Plan& p, size_t target) {
  Chunk pc, qc;
  size_t pElems = 0, qElems = 0, wire = 0;
  auto closeP = [&](bool force) {
    if (pc.last > pc.first && (force || pElems >= target)) {
      p.pChunks.push_back(pc);
      pc = Chunk{pc.last, pc.last, pc.offset + pc.count, 0};
      pElems = 0;
    }
  };
  auto closeQ = [&](bool force) {
    if (qc.last > qc.first && (force || qElems >= target)) {
      p.qChunks.push_back(qc);
      qc = Chunk{qc.last, qc.last, qc.offset + qc.count, 0};
      qElems = 0;
    }
  };
  pc.offset = p.payload().p;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    TensorPlan& tp = p.tensors[t];
    if (!tp.compressed) continue;
    const size_t n = tp.view.rows, m = tp.view.cols, k = size_t(tp.k);
    // Column blocks at least 512 wide: pass 2 and 3 read each row's block as one run of >= 2 KB,
    // which keeps a tall matrix (an embedding, 50257 x 768) streaming at memory speed.
    const size_t rowsPer = std::max<size_t>(1, target / m);
    const size_t colsPer = std::max<size_t>(std::min<size_t>(m, kMinColBlock), target / n);
    for (size_t r0 = 0; r0 < n; r0 += rowsPer) {
      const size_t r1 = std::min(n, r0 + rowsPer);
      p.rowBlocks.push_back({t, r0, r1});
      ++pc.last;
      pc.count += (r1 - r0) * k;
      pElems += (r1 - r0) * m;
      closeP(false);
    }
    tp.lastPChunk = p.pChunks.size() - (pc.last > pc.first ? 0 : 1);
    for (size_t c0 = 0; c0 < m; c0 += colsPer) {
      const size_t c1 = std::min(m, c0 + colsPer);
      p.colBlocks.push_back({t, c0, c1, wire});
      wire += (c1 - c0) * k;
      ++qc.last;
      qc.count += (c1 - c0) * k;
      qElems += (c1 - c0) * n;
      closeQ(false);
    }
  }
  closeP(true);
  closeQ(true);
  p.pChunks.back().count += 2;  // the non-finite count and the op check ride in the last P chunk
}

Status PlanCheck::read(const Plan& p, lowrankRedOp_t op, const void* buf, bool allocated,
                       uint64_t restored, uint64_t calls, bool* exactOnly, bool refused) const {
  if (words[0] == kPlanFailed && words[1] == kPlanFailed)
    return Status::Error(lowrankInvalidUsage,
                         "buffer %p: another comm rank could not plan this buffer (its error says "
                         "why: a layout whose elements are not the call's count, or a restored "
                         "state that does not fit?); this rank has "
                         "count %zu, dtype %s, op %s",
                         buf, p.count, dtypeName(p.dtype), opName(op));
  if (words[0] != p.hash || words[1] != ~p.hash)
    return Status::Error(lowrankInvalidUsage,
                         "buffer %p: comm ranks disagree on (count, dtype, op, layout, k, schedule "
                         "and its phase, factor dtype); this rank has count %zu, dtype %s, op %s, "
                         "%s, factors %s",
                         buf, p.count, dtypeName(p.dtype), opName(op),
                         p.alternate ? "alternating" : "PowerSGD's schedule",
                         wire::factorDtypeName(p.factorDtype));
  if (words[3] != restored || words[4] != ~restored)
    return Status::Error(lowrankInvalidUsage,
                         "buffer %p: comm ranks disagree on its restored state "
                         "(lowrankBufferRestoreState on some comm ranks only, or from different "
                         "steps); this rank %s",
                         buf, restored ? ("restored the state of call " + std::to_string(calls)).c_str()
                                       : "restored none");
  if (words[2] >= 2) {
    Status s = Status::Error(lowrankSystemError,
                             "buffer %p (count %zu): %s supplied allocator (lowrankCommSetAllocator) "
                             "could not give the memory of its compression state; the call failed "
                             "on every comm rank and changed nothing (call again once memory is "
                             "free)",
                             buf, p.count, refused ? "this comm rank's" : "another comm rank's");
    s.agreed = true;
    return s;
  }
  *exactOnly = words[2] != 0;
  if (*exactOnly)
    LR_WARN("buffer %p (count %zu): %s could not allocate the compression state; every comm rank "
            "allreduces this buffer exactly",
            buf, p.count, allocated ? "another comm rank" : "this comm rank");
  return Status::Ok();
}

BlockSpan rowSpan(const Plan& p, const RowBlock& b) {
  const TensorPlan& t = p.tensors[b.tensor];
  const size_t ld = t.view.stride(), skip = b.r0 * ld;
  BlockSpan s;
  s.tensor = b.tensor;
  s.first = b.r0;
  s.offset = t.offset + skip;
  s.valid = t.view.valid > skip ? t.view.valid - skip : 0;
  s.ld = ld;
  s.rows = b.r1 - b.r0;
  s.cols = t.view.cols;
  s.k = t.k;
  s.p = t.pOffset + b.r0 * size_t(t.k);
  s.qt = t.qOffset;
  s.qld = t.view.cols;
  return s;
}

BlockSpan colSpan(const Plan& p, const ColBlock& b) {
  const TensorPlan& t = p.tensors[b.tensor];
  BlockSpan s;
  s.tensor = b.tensor;
  s.first = b.c0;
  s.offset = t.offset + b.c0;
  s.valid = t.view.valid > b.c0 ? t.view.valid - b.c0 : 0;
  s.ld = t.view.stride();
  s.rows = t.view.rows;
  s.cols = b.c1 - b.c0;
  s.k = t.k;
  s.p = t.pOffset;
  s.qt = b.wireOffset;
  s.qld = b.c1 - b.c0;
  return s;
}

void describePlan(const Plan& p, uint64_t calls, lowrankBufferView_t* view) {
  view->planned = 1;
  view->perTensor = p.perTensor;
  view->ntensors = int(p.tensors.size());
  size_t biggest = 0;
  for (const auto& t : p.tensors) {
    if (!t.compressed) continue;
    ++view->ncompressed;
    if (t.numel > biggest) {
      biggest = t.numel;
      view->approxRank = t.k;
    }
  }
  view->rows = p.rows;
  view->cols = p.cols;
  view->padded = p.padded;
  view->calls = calls;
  view->pElements = p.pElems;
  view->qElements = p.qElems;
  view->exactElements = p.exactElems;
  view->chunks = p.pChunks.size();
}

host::MatrixView batchedView(size_t count) {
  host::MatrixView v;
  v.valid = count;
  const size_t s = isqrtCeil(count);
  for (size_t n = std::min(s, count); n >= 1; --n) {
    if (count % n) continue;
    const size_t m = count / n;
    if (m >= n && m <= 4 * n) {
      v.rows = n;
      v.cols = m;
      return v;
    }
    if (m > 4 * n) break;  // smaller n only stretches the aspect further
  }
  v.rows = v.cols = s;
  return v;
}

bool shouldCompress(size_t n, size_t m, int k, double rate) {
  if (k <= 0) return false;
  return double(n + m) * double(k) * rate < double(n) * double(m);
}

int declaredRank(int approxRank, const EngineConfig& cfg) {
  return approxRank == LOWRANK_RANK_DEFAULT ? cfg.approxRank : approxRank;
}

Status makePlan(size_t count, lowrankDataType_t dtype, lowrankRedOp_t op, const Layout* layout,
                const EngineConfig& cfg, Plan* out, const TensorIds* ids) {
  Plan p;
  p.count = count;
  p.dtype = dtype;
  uint64_t h = mix(mix(mix(0x6c6f7772616e6bull, count), uint64_t(dtype)), uint64_t(cfg.approxRank));
  h = mix(h, uint64_t(op == lowrankAvg ? lowrankSum : op));  // sum and avg share a plan
  // Tensor i's k as declared, and who it is (the hash covers both).
  auto declared = [&](TensorPlan& t, size_t i) {
    if (!ids) return cfg.approxRank;
    const int k = declaredRank(ids->ranks[i], cfg);
    t.id = ids->ids[i];
    h = mix(mix(h, t.id), uint64_t(int64_t(k)));
    return k;
  };
  if (layout) {
    size_t total = 0, offset = 0;
    for (const Shape& s : *layout) {
      size_t numel = 1;
      for (size_t d : s) numel *= d;
      total += numel;
    }
    if (total != count)
      return Status::Error(lowrankInvalidUsage,
                           "the buffer's layout holds %zu elements but the call has count %zu",
                           total, count);
    p.perTensor = true;
    for (size_t i = 0; i < layout->size(); ++i) {
      const Shape& s = (*layout)[i];
      TensorPlan t;
      const int k = declared(t, i);
      t.offset = offset;
      t.numel = 1;
      for (size_t d : s) t.numel *= d;
      offset += t.numel;
      h = mix(h, s.size());
      for (size_t d : s) h = mix(h, d);
      if (s.size() >= 2) {
        t.view.rows = s[0];
        t.view.cols = t.numel / s[0];
        t.view.valid = t.numel;
        addCompressed(p, t, cfg, k);
      } else {  // biases, norms: exact, as PyTorch's hook
        t.exactOffset = p.exactElems;
        p.exactElems += t.numel;
        p.tensors.push_back(t);
      }
    }
  } else {
    TensorPlan t;
    t.numel = count;
    t.view = batchedView(count);
    p.rows = t.view.rows;
    p.cols = t.view.cols;
    p.padded = t.view.rows * t.view.cols - count;
    addCompressed(p, t, cfg, declared(t, 0));
  }
  // Pipeline when there are at least two chunks' worth of compressed elements. The chunking
  // decides the allreduces, so it is part of what the ranks must agree on.
  if (cfg.pipeline && p.compressedElems >= 2 * cfg.pipelineChunk) {
    p.pipelined = true;
    makeChunks(p, size_t(cfg.pipelineChunk));
    h = mix(h, cfg.pipelineChunk);
  } else if (p.compressedElems) {
    makeChunks(p, SIZE_MAX / 4);  // one chunk per phase: the schedule without overlap
  }
  // 16-bit factors change every factor message: ranks must agree (float32 keeps the old hashes).
  p.factorDtype = cfg.factorDtype;
  if (cfg.factorDtype != lowrankFloat32) h = mix(h, 0x666163746f72ull + uint64_t(cfg.factorDtype));
  p.hash = mix(h, p.pipelined);
  *out = std::move(p);
  return Status::Ok();
}

}  // namespace lowrank
