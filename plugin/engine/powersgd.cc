#include "engine/powersgd.h"

#include <algorithm>

#include "engine/phases.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "util/dtype.h"

namespace lowrank {

Status runCompressed(BufferState& st, const EngineConfig& cfg, const void* sendbuff, void* recvbuff,
                     lowrankRedOp_t op, Transport& transport, CompressedResult* result) {
  const int N = transport.size();
  const auto [pl, es, send, recv, e, pay, p, qt] = phases::callBuffers(st, cfg, sendbuff, recvbuff);

  phases::prepareQ(st, cfg);

  // Pass 1 and the exact part, then allreduce #1.
  size_t bad = phases::packExact(pl, sendbuff, pay);
  for (const TensorPlan& t : pl.tensors)
    if (t.compressed)
      bad += host::errorFeedbackAndP(send + t.offset * es, pl.dtype, e ? e + t.offset : nullptr,
                                     t.view, qt + t.qOffset, t.k, p + t.pOffset,
                                     phases::overflowLimit(t, N));
  phases::setChecks(pl, pay, bad, op);
  LR_RETURN_IF_ERROR(transport.allreduce(pay, pl.payloadElems(), lowrankFloat32, lowrankSum));
  LR_RETURN_IF_ERROR(phases::readChecks(pl, pay, op, N, &result->fellBack));
  if (result->fellBack) return Status::Ok();
  phases::unpackExact(pl, pay, recvbuff, op, N);

  // Orthonormalize P, pass 2, allreduce #2.
  for (const TensorPlan& t : pl.tensors) {
    if (!t.compressed) continue;
    host::orthonormalize(p + t.pOffset, t.view.rows, t.k, size_t(t.k), 1, cfg.orthoEpsilon);
    host::computeQ(send + t.offset * es, pl.dtype, e ? e + t.offset : nullptr, t.view,
                   p + t.pOffset, t.k, qt + t.qOffset);
  }
  LR_RETURN_IF_ERROR(transport.allreduce(qt, pl.qElems, lowrankFloat32, lowrankSum));
  host::scale(qt, pl.qElems, 1.f / float(N));  // Qbar, kept for the next call

  // Pass 3.
  const float outScale = op == lowrankSum ? float(N) : 1.f;
  for (const TensorPlan& t : pl.tensors)
    if (t.compressed)
      host::decompressAndUpdateError(e ? e + t.offset : nullptr, t.view, p + t.pOffset,
                                     qt + t.qOffset, t.k, outScale, recv + t.offset * es,
                                     pl.dtype);
  st.haveQ = true;
  return Status::Ok();
}

}  // namespace lowrank
