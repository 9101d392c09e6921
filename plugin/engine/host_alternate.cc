// Alternating PowerSGD on the host (host_schedule.h, runAlternateOnHost; docs/design.md,
// "Alternating factors"): one factor allreduce per call, pipelined chunk by chunk as PowerSGD's.
#include <algorithm>
#include <vector>

#include "engine/host_schedule.h"
#include "engine/phases.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "util/dtype.h"

namespace lowrank {

using namespace hostpay;

Status runAlternateOnHost(HostState& st, const Plan& pl, const EngineConfig& cfg,
                          const void* sendbuff, void* recvbuff, lowrankRedOp_t op,
                          const float* freshQ, bool qStep, AsyncTransport& tr, bool* fellBack) {
  using Ticket = AsyncTransport::Ticket;
  const int N = tr.size();
  const size_t es = dtypeSize(pl.dtype);
  const char* send = static_cast<const char*>(sendbuff);
  char* recv = static_cast<char*>(recvbuff);
  float* e = cfg.errorFeedback ? st.error.data() : nullptr;
  float* p = st.payload.data() + pl.payload().p;  // P: this step's (P step), the kept one (Q step)
  float* qt = st.qt.data();                       // the kept Q, whole-tensor layout
  // This step's allreduce: the payload (P step) or the Q payload (Q step), each chunk a slice.
  const lowrankPayloadLayout_t at = qStep ? pl.qPayload() : pl.payload();
  float* pay = qStep ? st.qwire.data() : st.payload.data();
  const std::vector<Chunk>& chunks = qStep ? pl.qChunks : pl.pChunks;
  const size_t base = qStep ? at.p : 0;  // Q chunk offsets count from the Q part; P's already
                                         // count from the payload's start
  auto failed = [&](Status s) {
    tr.waitAll();
    return s;
  };

  // The kept factor, identical on every rank, orthonormalized here (the fresh Q already is).
  for (const TensorPlan& t : pl.tensors) {
    if (!t.compressed) continue;
    if (qStep)
      host::orthonormalize(p + t.pOffset, t.view.rows, t.k, size_t(t.k), 1, cfg.orthoEpsilon);
    else if (!freshQ)
      host::orthonormalize(qt + t.qOffset, t.view.cols, t.k, 1, t.view.cols, cfg.orthoEpsilon);
  }
  if (freshQ && !qStep) std::copy_n(freshQ, pl.qElems, qt);

  size_t bad = packExact(pl, sendbuff, pay);
  const bool exactApart = pl.exactElems && chunks.size() > 1;
  if (exactApart) tr.post(pay, pl.exactElems, lowrankFloat32, lowrankSum);

  // The one pass over M, chunk by chunk; each chunk posted as soon as computed. A Q step leaves
  // its residual to the next P step (host_backend.h, HostState::residualPending): 16 bytes per
  // element over the two steps instead of 20.
  const float* pendingQ = !qStep && e && st.residualPending ? st.ownQ.data() : nullptr;
  st.residualPending = false;  // taken below (a failed call resets the whole state)
  std::vector<Ticket> ticket(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& ch = chunks[c];
    for (size_t b = ch.first; b < ch.last; ++b) {
      const BlockSpan s = qStep ? colSpan(pl, pl.colBlocks[b]) : rowSpan(pl, pl.rowBlocks[b]);
      const float limit = phases::overflowLimit(pl.tensors[s.tensor], N, pl.factorDtype);
      if (!qStep) {
        bad += host::alternateStepP(send + s.offset * es, pl.dtype, e ? e + s.offset : nullptr,
                                    s.view(), qt + s.qt, s.k, p + s.p, limit, pl.factorDtype,
                                    pendingQ ? pendingQ + s.qt : nullptr);
        continue;
      }
      float* ownQ = pay + base + s.qt;
      bad += host::alternateStepQ(send + s.offset * es, pl.dtype, e ? e + s.offset : nullptr,
                                  s.view(), p + s.p, s.k, ownQ, limit, pl.factorDtype,
                                  /*deferResidual=*/e != nullptr);
      if (!e) continue;
      const TensorPlan& t = pl.tensors[s.tensor];
      for (int j = 0; j < s.k; ++j)  // kept in the tensor's whole Qt layout, before the allreduce
        std::copy_n(ownQ + size_t(j) * s.qld, s.cols,
                    st.ownQ.data() + t.qOffset + size_t(j) * t.view.cols + s.first);
    }
    const bool last = c + 1 == chunks.size();
    if (last) {  // the checks: the non-finite count (exact in float), the op
      pay[at.flag] = float(std::min<size_t>(bad, size_t(1) << 20));
      pay[at.op] = lowrankPayloadOpCode(op);
    }
    // P chunks: the last one's count already holds the checks (plan.h); Q chunks': not.
    const size_t from = c == 0 && !exactApart ? 0 : base + ch.offset;
    const size_t to = base + ch.offset + ch.count + (qStep && last ? 2 : 0);
    ticket[c] = tr.post(pay + from, to - from, lowrankFloat32, lowrankSum,
                        pl.factorWire(from, to - from, at.p, at.flag));
  }
  Status s = tr.wait(ticket.back());
  if (s.ok()) s = readChecks(at, pay, op, N, fellBack);
  if (!s.ok() || *fellBack) return failed(s);
  st.residualPending = qStep && e;
  unpackExact(pl, pay, recvbuff, op, N);

  // The decompression, out = s P Q^T from the reduced factor and the kept one (no E: the P step's
  // residual is taken, the Q step's left to the next P step). The reduced factor is kept: Pbar in
  // the payload, Qbar in the whole Qt. Every factor is in by now (the checks ride in the last
  // chunk), so a Q step first puts each block's Qbar into its tensor's whole Qt, and both steps
  // then write the output by row blocks, whole rows at a time: one loop, where a Q step's column
  // blocks swept every row once per block (no faster or slower, measured:
  // studies/ab/results/issue44_rowdec_ab.md). Each element's products are the same either way.
  const float outScale = op == lowrankSum ? float(N) : 1.f;
  for (const Chunk& ch : chunks) {
    host::scale(pay + base + ch.offset, ch.count - (!qStep && &ch == &chunks.back() ? 2 : 0),
                1.f / float(N));
    if (!qStep) continue;
    for (size_t b = ch.first; b < ch.last; ++b) {
      const BlockSpan sp = colSpan(pl, pl.colBlocks[b]);
      const TensorPlan& t = pl.tensors[sp.tensor];
      const float* qbar = pay + base + sp.qt;
      for (int j = 0; j < sp.k; ++j)  // the block's Qbar into the tensor's whole Qt
        std::copy_n(qbar + size_t(j) * sp.qld, sp.cols,
                    qt + t.qOffset + size_t(j) * t.view.cols + sp.first);
    }
  }
  for (const RowBlock& rb : pl.rowBlocks) {
    const BlockSpan sp = rowSpan(pl, rb);
    host::decompressAndUpdateError(nullptr, sp.view(), p + sp.p, qt + sp.qt, sp.k, outScale,
                                   recv + sp.offset * es, pl.dtype);
  }
  return Status::Ok();
}

}  // namespace lowrank
