#include "engine/powersgd.h"

#include <algorithm>
#include <cstdint>

#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "kernels/host/random.h"
#include "util/dtype.h"

namespace lowrank {

Status runCompressed(BufferState& st, const EngineConfig& cfg, const void* sendbuff, void* recvbuff,
                     lowrankRedOp_t op, Transport& transport, CompressedResult* result) {
  const Plan& pl = st.plan;
  const size_t es = dtypeSize(pl.dtype);
  const int N = transport.size();
  const auto* send = static_cast<const char*>(sendbuff);
  auto* recv = static_cast<char*>(recvbuff);
  float* e = cfg.errorFeedback ? st.error.data() : nullptr;
  float* pay = st.payload.data();
  float* qt = st.qt.data();
  float* exact = pay + pl.pElems;
  const size_t flag = pl.pElems + pl.exactElems;

  // Q: drawn at the first call (same seed on every rank; a reset buffer draws the same Q again),
  // else the last call's Qbar (warm start);
  // orthonormalized either way, which keeps P = M Q well scaled without changing its span.
  const bool fresh = !st.haveQ || !cfg.warmStart;
  for (size_t i = 0; i < pl.tensors.size(); ++i) {
    const TensorPlan& t = pl.tensors[i];
    if (!t.compressed) continue;
    float* q = qt + t.qOffset;
    if (fresh)
      host::fillNormal(q, size_t(t.k) * t.view.cols, cfg.seed, (st.calls << 20) ^ i);
    host::orthonormalize(q, t.view.cols, t.k, 1, t.view.cols, cfg.orthoEpsilon);
  }

  // Pass 1 and the exact part, then allreduce #1.
  size_t bad = 0;
  for (const TensorPlan& t : pl.tensors) {
    const char* g = send + t.offset * es;
    if (t.compressed) {
      bad += host::errorFeedbackAndP(g, pl.dtype, e ? e + t.offset : nullptr, t.view,
                                     qt + t.qOffset, t.k, pay + t.pOffset);
    } else {
      host::toFloat32(g, pl.dtype, t.numel, exact + t.exactOffset);
      bad += host::countNonFinite(exact + t.exactOffset, t.numel, lowrankFloat32);
    }
  }
  pay[flag] = float(std::min<size_t>(bad, size_t(1) << 20));  // exact in float32; > 0 is all we need
  LR_RETURN_IF_ERROR(transport.allreduce(pay, flag + 1, lowrankFloat32, lowrankSum));
  if (pay[flag] != 0.f) {
    result->fellBack = true;
    return Status::Ok();
  }

  const float outScale = op == lowrankSum ? float(N) : 1.f;
  for (const TensorPlan& t : pl.tensors)
    if (!t.compressed)
      host::fromFloat32(exact + t.exactOffset, t.numel, op == lowrankAvg ? 1.f / float(N) : 1.f,
                        recv + t.offset * es, pl.dtype);

  // Orthonormalize P, pass 2, allreduce #2.
  for (const TensorPlan& t : pl.tensors) {
    if (!t.compressed) continue;
    host::orthonormalize(pay + t.pOffset, t.view.rows, t.k, size_t(t.k), 1, cfg.orthoEpsilon);
    host::computeQ(send + t.offset * es, pl.dtype, e ? e + t.offset : nullptr, t.view,
                   pay + t.pOffset, t.k, qt + t.qOffset);
  }
  LR_RETURN_IF_ERROR(transport.allreduce(qt, pl.qElems, lowrankFloat32, lowrankSum));
  host::scale(qt, pl.qElems, 1.f / float(N));  // Qbar, kept for the next call

  // Pass 3.
  for (const TensorPlan& t : pl.tensors)
    if (t.compressed)
      host::decompressAndUpdateError(e ? e + t.offset : nullptr, t.view, pay + t.pOffset,
                                     qt + t.qOffset, t.k, outScale, recv + t.offset * es,
                                     pl.dtype);
  st.haveQ = true;
  return Status::Ok();
}

}  // namespace lowrank
