#include "engine/phases.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "kernels/host/random.h"
#include "abi/cuda_backend.h"
#include "util/dtype.h"

namespace lowrank::phases {

CallBuffers callBuffers(const Plan& pl, HostState& st, const EngineConfig& cfg,
                        const void* sendbuff, void* recvbuff) {
  float* pay = st.payload.data();
  return CallBuffers{pl,
                     dtypeSize(pl.dtype),
                     static_cast<const char*>(sendbuff),
                     static_cast<char*>(recvbuff),
                     cfg.errorFeedback ? st.error.data() : nullptr,
                     pay,
                     pay + pl.pBase(),
                     st.qt.data()};
}

void drawNormal(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q) {
  host::fillNormal(q, size_t(t.k) * t.view.cols, cfg.seed, stream);
}

void drawQ(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q) {
  drawNormal(t, cfg, stream, q);
  host::orthonormalize(q, t.view.cols, t.k, 1, t.view.cols, cfg.orthoEpsilon);
}

uint64_t idStream(uint64_t id, uint64_t calls) { return mix(mix(0x7465'6e73'6f72'6964ull, id), calls); }

uint64_t qStream(const Plan& pl, size_t t, uint64_t calls) {
  return pl.synthetic ? (calls << 20) ^ t : idStream(pl.tensors[t].id, calls);
}

void initialQ(const Plan& pl, const EngineConfig& cfg, const uint64_t* tensorCalls, float* qt) {
  for (size_t i = 0; i < pl.tensors.size(); ++i)
    if (pl.tensors[i].compressed)
      drawQ(pl.tensors[i], cfg, qStream(pl, i, tensorCalls[i]), qt + pl.tensors[i].qOffset);
}

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

float overflowLimit(const TensorPlan& t, int N) {
  const double grow = 16.0 * N * t.k * std::sqrt(double(std::max(t.view.rows, t.view.cols)));
  return float(double(FLT_MAX) / grow);
}

float opCode(lowrankRedOp_t op) { return lowrankPayloadOpCode(op); }

void setChecks(const Plan& pl, float* payload, size_t nonFinite, lowrankRedOp_t op) {
  payload[pl.flagIndex()] = float(std::min<size_t>(nonFinite, size_t(1) << 20));  // exact in float
  payload[pl.opIndex()] = opCode(op);
}

Status readChecks(const Plan& pl, const float* payload, lowrankRedOp_t op, int N, bool* fellBack) {
  const float mine = opCode(op);
  if (payload[pl.opIndex()] != mine * float(N))
    return Status::Error(lowrankInvalidUsage,
                         "the comm ranks called this buffer with different ops (sum and avg); this "
                         "rank used %s", op == lowrankSum ? "sum" : "avg");
  *fellBack = payload[pl.flagIndex()] != 0.f;
  return Status::Ok();
}

}  // namespace lowrank::phases
