#include <algorithm>
#include <vector>

#include "engine/host_backend.h"
#include "engine/phases.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "util/dtype.h"

namespace lowrank {

Status runCompressed(HostState& st, const Plan& plan, const EngineConfig& cfg, const void* sendbuff,
                     void* recvbuff, lowrankRedOp_t op, const float* freshQ, AsyncTransport& tr,
                     bool* fellBack) {
  using Ticket = AsyncTransport::Ticket;
  const int N = tr.size();
  const auto [pl, es, send, recv, e, pay, p, qt] =
      phases::callBuffers(plan, st, cfg, sendbuff, recvbuff);
  float* wire = st.qwire.data();
  // Posted slices must stay untouched until reduced: on any error, let the queue drain first.
  auto failed = [&](Status s) {
    tr.waitAll();
    return s;
  };

  // Q: the fresh one given, else the last call's Qbar (warm start), orthonormalized.
  if (freshQ) {
    std::copy_n(freshQ, pl.qElems, qt);
  } else {
    for (const TensorPlan& t : pl.tensors)
      if (t.compressed)
        host::orthonormalize(qt + t.qOffset, t.view.cols, t.k, 1, t.view.cols, cfg.orthoEpsilon);
  }

  // The exact part travels first, under pass 1. With one P chunk there is nothing to overlap: it
  // rides with that chunk, one allreduce of [exact part | P | checks] (a call fewer per buffer).
  size_t bad = phases::packExact(pl, sendbuff, pay);
  const bool exactApart = pl.exactElems && pl.pChunks.size() > 1;
  if (exactApart) tr.post(pay, pl.exactElems, lowrankFloat32, lowrankSum);

  // Pass 1 by row blocks; each P chunk is posted as soon as it is computed.
  std::vector<Ticket> pTicket(pl.pChunks.size());
  for (size_t c = 0; c < pl.pChunks.size(); ++c) {
    const Chunk& ch = pl.pChunks[c];
    for (size_t b = ch.first; b < ch.last; ++b) {
      const BlockSpan s = rowSpan(pl, pl.rowBlocks[b]);
      bad += host::errorFeedbackAndP(send + s.offset * es, pl.dtype, e ? e + s.offset : nullptr,
                                     s.view(), qt + s.qt, s.k, p + s.p,
                                     phases::overflowLimit(pl.tensors[s.tensor], N));
    }
    if (c + 1 == pl.pChunks.size()) phases::setChecks(pl, pay, bad, op);
    const size_t from = c == 0 && !exactApart ? 0 : ch.offset;  // the exact part before chunk 0
    pTicket[c] = tr.post(pay + from, ch.offset + ch.count - from, lowrankFloat32, lowrankSum);
  }

  // Pass 2 by column blocks; a tensor is orthonormalized once its last P chunk is reduced.
  // Speculative with respect to the non-finite count (it arrives with the last P chunk): pass 2
  // changes no state, and pass 3 waits for Q chunks, which the transport runs after every P chunk.
  std::vector<char> orthonormal(pl.tensors.size(), 0);
  std::vector<Ticket> qTicket(pl.qChunks.size());
  for (size_t c = 0; c < pl.qChunks.size(); ++c) {
    const Chunk& ch = pl.qChunks[c];
    for (size_t b = ch.first; b < ch.last; ++b) {
      const BlockSpan sp = colSpan(pl, pl.colBlocks[b]);
      const TensorPlan& t = pl.tensors[sp.tensor];
      if (!orthonormal[sp.tensor]) {
        Status s = tr.wait(pTicket[t.lastPChunk]);
        if (!s.ok()) return failed(s);
        host::orthonormalize(p + t.pOffset, t.view.rows, t.k, size_t(t.k), 1, cfg.orthoEpsilon);
        orthonormal[sp.tensor] = 1;
      }
      host::computeQ(send + sp.offset * es, pl.dtype, e ? e + sp.offset : nullptr, sp.view(),
                     p + sp.p, sp.k, wire + sp.qt);
    }
    qTicket[c] = tr.post(wire + ch.offset, ch.count, lowrankFloat32, lowrankSum);
  }

  Status s = tr.wait(pTicket.back());
  if (s.ok()) s = phases::readChecks(pl, pay, op, N, fellBack);
  if (!s.ok() || *fellBack) return failed(s);
  phases::unpackExact(pl, pay, recvbuff, op, N);  // posted before (or with) the first P chunk

  // Pass 3 chunk by chunk as Q arrives; Qbar goes back to the whole-tensor layout for warm start.
  const float outScale = op == lowrankSum ? float(N) : 1.f;
  for (size_t c = 0; c < pl.qChunks.size(); ++c) {
    const Chunk& ch = pl.qChunks[c];
    s = tr.wait(qTicket[c]);
    if (!s.ok()) return failed(s);
    host::scale(wire + ch.offset, ch.count, 1.f / float(N));
    for (size_t b = ch.first; b < ch.last; ++b) {
      const BlockSpan sp = colSpan(pl, pl.colBlocks[b]);
      const TensorPlan& t = pl.tensors[sp.tensor];
      host::decompressAndUpdateError(e ? e + sp.offset : nullptr, sp.view(), p + sp.p,
                                     wire + sp.qt, sp.k, outScale, recv + sp.offset * es, pl.dtype);
      for (int j = 0; j < sp.k; ++j)  // the block's Qbar into the tensor's whole Qt
        std::copy_n(wire + sp.qt + size_t(j) * sp.qld, sp.cols,
                    qt + t.qOffset + size_t(j) * t.view.cols + sp.first);
    }
  }
  return Status::Ok();
}

}  // namespace lowrank
