#include "engine/host_schedule.h"

#include <algorithm>
#include <vector>

#include "engine/phases.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "util/dtype.h"

namespace lowrank {
namespace hostpay {

size_t packExact(const Plan& pl, const void* sendbuff, float* payload) {
  const size_t es = dtypeSize(pl.dtype);
  size_t bad = 0;
  for (const TensorPlan& t : pl.tensors) {
    if (t.compressed) continue;
    float* dst = payload + t.exactOffset;
    host::toFloat32(static_cast<const char*>(sendbuff) + t.offset * es, pl.dtype, t.numel, dst);
    bad += host::countNonFinite(dst, t.numel, lowrankFloat32);
  }
  return bad;
}

void unpackExact(const Plan& pl, const float* payload, void* recvbuff, lowrankRedOp_t op, int N) {
  const size_t es = dtypeSize(pl.dtype);
  for (const TensorPlan& t : pl.tensors)
    if (!t.compressed)
      host::fromFloat32(payload + t.exactOffset, t.numel, op == lowrankAvg ? 1.f / float(N) : 1.f,
                        static_cast<char*>(recvbuff) + t.offset * es, pl.dtype);
}

Status readChecks(const lowrankPayloadLayout_t& at, const float* payload, lowrankRedOp_t op,
                  int N, bool* fellBack) {
  if (payload[at.op] != lowrankPayloadOpCode(op) * float(N))
    return Status::Error(lowrankInvalidUsage,
                         "the comm ranks called this buffer with different ops (sum and avg); this "
                         "rank used %s", op == lowrankSum ? "sum" : "avg");
  *fellBack = payload[at.flag] != 0.f;
  return Status::Ok();
}

}  // namespace hostpay

using namespace hostpay;

Status runCompressedOnHost(HostState& st, const Plan& pl, const EngineConfig& cfg,
                           const void* sendbuff, void* recvbuff, lowrankRedOp_t op,
                           const float* freshQ, AsyncTransport& tr, bool* fellBack) {
  using Ticket = AsyncTransport::Ticket;
  const int N = tr.size();
  const size_t es = dtypeSize(pl.dtype);
  const char* send = static_cast<const char*>(sendbuff);
  char* recv = static_cast<char*>(recvbuff);
  float* e = cfg.errorFeedback ? st.error.data() : nullptr;  // E (holds M after pass 1)
  float* pay = st.payload.data();  // allreduce #1 (abi/cuda_backend.h: lowrankPayload)
  float* p = pay + pl.payload().p;
  float* qt = st.qt.data();        // Qt of every compressed tensor, whole-tensor layout
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
  size_t bad = packExact(pl, sendbuff, pay);
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
                                     phases::overflowLimit(pl.tensors[s.tensor], N, pl.factorDtype));
    }
    if (c + 1 == pl.pChunks.size()) {  // the checks: the non-finite count (exact in float), the op
      pay[pl.payload().flag] = float(std::min<size_t>(bad, size_t(1) << 20));
      pay[pl.payload().op] = lowrankPayloadOpCode(op);
    }
    const size_t from = c == 0 && !exactApart ? 0 : ch.offset;  // the exact part before chunk 0
    const size_t len = ch.offset + ch.count - from;
    pTicket[c] = tr.post(pay + from, len, lowrankFloat32, lowrankSum,
                         pl.factorWire(from, len, pl.payload().p, pl.payload().flag));
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
    qTicket[c] = tr.post(wire + ch.offset, ch.count, lowrankFloat32, lowrankSum,
                         pl.factorWire(ch.offset, ch.count, 0, pl.qElems));
  }

  Status s = tr.wait(pTicket.back());
  if (s.ok()) s = readChecks(pl.payload(), pay, op, N, fellBack);
  if (!s.ok() || *fellBack) return failed(s);
  unpackExact(pl, pay, recvbuff, op, N);  // posted before (or with) the first P chunk

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
