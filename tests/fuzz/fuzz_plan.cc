// Fuzz target: makePlan (plugin/engine/plan.cc) over batched and per-tensor layouts, every
// configuration of rank, compression rate and pipelining. Checks what the engine relies on: the
// tensors tile the buffer, the factor slices tile the packed factor buffers, and the pipelined
// chunks allreduce exactly the P rows and Q columns their blocks compute.
#include <algorithm>
#include <cmath>
#include <string>

#include "engine/plan.h"
#include "tests/fuzz/fuzz_input.h"

using namespace lowrank;

namespace {

constexpr const char* kName = "plan";
#define CHECK(cond) FUZZ_CHECK(kName, cond, #cond)

void checkPipeline(const Plan& p, size_t target) {
  // Row blocks: per compressed tensor, in order, rows [0, n) in pieces of at most target / m rows.
  size_t b = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const TensorPlan& tp = p.tensors[t];
    if (!tp.compressed) continue;
    const size_t n = tp.view.rows, m = tp.view.cols;
    for (size_t r = 0; r < n; ++b) {
      CHECK(b < p.rowBlocks.size());
      const RowBlock& rb = p.rowBlocks[b];
      CHECK(rb.tensor == t && rb.r0 == r && rb.r1 > rb.r0 && rb.r1 <= n);
      CHECK(rb.r1 - rb.r0 == 1 || (rb.r1 - rb.r0) * m <= target);
      r = rb.r1;
    }
  }
  CHECK(b == p.rowBlocks.size());
  // P chunks: consecutive runs of blocks whose P rows are consecutive in the payload.
  CHECK(!p.pChunks.empty());
  size_t next = 0, off = p.payload().p;
  for (size_t c = 0; c < p.pChunks.size(); ++c) {
    const Chunk& ch = p.pChunks[c];
    CHECK(ch.first == next && ch.last > ch.first && ch.offset == off);
    size_t count = 0;
    for (size_t i = ch.first; i < ch.last; ++i) {
      const RowBlock& rb = p.rowBlocks[i];
      const TensorPlan& tp = p.tensors[rb.tensor];
      CHECK(p.payload().p + tp.pOffset + rb.r0 * size_t(tp.k) == off + count);
      count += (rb.r1 - rb.r0) * size_t(tp.k);
      if (rb.r1 == tp.view.rows) CHECK(tp.lastPChunk == c);
    }
    if (c + 1 == p.pChunks.size()) count += 2;  // the check words
    CHECK(ch.count == count);
    next = ch.last;
    off += ch.count;
  }
  CHECK(next == p.rowBlocks.size() && off == p.payload().elems);
  // Column blocks and Q chunks: the wire holds every block's Qt in block order.
  size_t wire = 0;
  b = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const TensorPlan& tp = p.tensors[t];
    if (!tp.compressed) continue;
    for (size_t c = 0; c < tp.view.cols; ++b) {
      CHECK(b < p.colBlocks.size());
      const ColBlock& cb = p.colBlocks[b];
      CHECK(cb.tensor == t && cb.c0 == c && cb.c1 > cb.c0 && cb.c1 <= tp.view.cols);
      CHECK(cb.wireOffset == wire);
      wire += (cb.c1 - cb.c0) * size_t(tp.k);
      c = cb.c1;
    }
  }
  CHECK(b == p.colBlocks.size() && wire == p.qElems);
  next = 0;
  off = 0;
  for (const Chunk& ch : p.qChunks) {
    CHECK(ch.first == next && ch.last > ch.first && ch.offset == off);
    CHECK(p.colBlocks[ch.first].wireOffset == off);
    next = ch.last;
    off += ch.count;
  }
  CHECK(next == p.colBlocks.size() && off == p.qElems);
}

void checkPlan(const Plan& p, size_t count, const Layout* layout, const EngineConfig& cfg) {
  CHECK(p.count == count && p.perTensor == (layout != nullptr));
  CHECK(!layout || p.tensors.size() == layout->size());
  CHECK(layout || p.tensors.size() == 1);
  size_t offset = 0, pe = 0, qe = 0, ee = 0, ce = 0;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const TensorPlan& t = p.tensors[i];
    CHECK(t.offset == offset && t.numel >= 1);
    offset += t.numel;
    const bool matrix = !layout || (*layout)[i].size() >= 2;
    if (t.compressed) {
      CHECK(matrix);
      const size_t n = t.view.rows, m = t.view.cols;
      CHECK(t.k >= 1 && size_t(t.k) == std::min<size_t>({size_t(cfg.approxRank), n, m}));
      CHECK(shouldCompress(n, m, t.k, cfg.minCompressionRate));
      CHECK(t.view.valid == t.numel);
      if (layout) CHECK(n == (*layout)[i][0] && n * m == t.numel);
      CHECK(t.pOffset == pe && t.qOffset == qe);
      pe += n * size_t(t.k);
      qe += m * size_t(t.k);
      ce += t.numel;
    } else {
      if (matrix)
        CHECK(cfg.approxRank == 0 ||
              !shouldCompress(t.view.rows, t.view.cols,
                              int(std::min<size_t>({size_t(cfg.approxRank), t.view.rows,
                                                    t.view.cols})),
                              cfg.minCompressionRate));
      CHECK(t.exactOffset == ee);
      ee += t.numel;
    }
  }
  CHECK(offset == count);
  CHECK(p.pElems == pe && p.qElems == qe && p.exactElems == ee && p.compressedElems == ce);
  if (!layout) {
    const size_t n = p.rows, m = p.cols;
    CHECK(n * m >= count && p.padded == n * m - count);
    CHECK((n * m == count && n <= m && m <= 4 * n) ||
          (n == m && n * n >= count && (n - 1) * (n - 1) < count));
  }
  CHECK(p.pipelined == (cfg.pipeline && ce >= 2 * cfg.pipelineChunk));
  // Every plan with compressed tensors is chunked: by pipelineChunk when pipelined, else in one
  // chunk per phase (the schedule without overlap).
  if (p.pipelined) {
    checkPipeline(p, size_t(cfg.pipelineChunk));
  } else if (ce) {
    checkPipeline(p, SIZE_MAX / 4);
    CHECK(p.pChunks.size() == 1 && p.qChunks.size() == 1);
  } else {
    CHECK(p.rowBlocks.empty() && p.pChunks.empty() && p.qChunks.empty());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  EngineConfig cfg;
  cfg.approxRank = int(in.range(0, 40));
  cfg.minCompressionRate = 1 + double(in.range(0, 40)) / 4;
  cfg.pipeline = in.flag();
  cfg.pipelineChunk = in.flag() ? uint64_t(1) << in.range(0, 16) : in.range(1, 100000);
  const lowrankDataType_t dtype = in.flag() ? lowrankFloat32 : lowrankBfloat16;
  const lowrankRedOp_t op = in.flag() ? lowrankSum : lowrankAvg;

  Layout layout;
  size_t count = 0;
  const bool perTensor = in.flag();
  if (perTensor) {
    for (size_t t = in.range(1, 12); t > 0; --t) {
      Shape s(in.range(1, 4));
      size_t numel = 1;
      for (size_t& d : s) {
        d = in.flag() ? in.range(1, 4000) : in.range(1, 40);
        if (numel * d > (size_t(1) << 22)) d = 1;  // keeps a run small
        numel *= d;
      }
      layout.push_back(s);
      count += numel;
    }
  } else {
    count = in.range(1, size_t(1) << 22);
  }
  const size_t extra = perTensor && in.byte() < 16 ? in.range(1, 9) : 0;  // a wrong count

  Plan plan;
  const Status st = makePlan(count + extra, dtype, op, perTensor ? &layout : nullptr, cfg, &plan);
  if (extra) {
    CHECK(!st.ok() && st.code == lowrankInvalidUsage && !st.msg.empty());
    return 0;
  }
  CHECK(st.ok());
  checkPlan(plan, count, perTensor ? &layout : nullptr, cfg);

  // The same call plans the same (the ranks' agreement rests on it), avg as sum.
  Plan again;
  CHECK(makePlan(count, dtype, op == lowrankSum ? lowrankAvg : lowrankSum,
                 perTensor ? &layout : nullptr, cfg, &again).ok());
  CHECK(again.hash == plan.hash);
  bool exactOnly = true;
  const PlanCheck check(st, plan, true, 0);
  CHECK(check.read(plan, op, nullptr, true, 0, 0, &exactOnly).ok() && !exactOnly);
  return 0;
}
