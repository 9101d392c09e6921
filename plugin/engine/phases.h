// What host and device buffers share of a compressed call's numbers: the first Q (drawn on the
// host for both) and the overflow bound of pass 1.
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/engine_config.h"
#include "engine/plan.h"

namespace lowrank::phases {

// The fresh Qt of every compressed tensor (qt: plan.qElems floats, at each tensor's qOffset), for
// host and device buffers alike: drawn from N(0, 1) with cfg.seed and the tensor's stream
// (qStream), so every comm rank draws the same Q (and a reset buffer the same again), then
// orthonormalized, which keeps P = M Q well scaled without changing its span. tensorCalls[t]:
// tensor t's calls, this one included. Without it the call warm-starts from the last Qbar.
void initialQ(const Plan& pl, const EngineConfig& cfg, const uint64_t* tensorCalls, float* qt);
// The stream of tensor t's fresh Q at its call number `calls`: from its id, so that a tensor draws
// the same Q whatever buffer or position it is in; for a buffer without ids (synthetic ids: the
// positions), (calls << 20) ^ position, the draw of buffers before tensor ids, kept bit for bit.
uint64_t qStream(const Plan& pl, size_t t, uint64_t calls);
uint64_t idStream(uint64_t id, uint64_t calls);
// One compressed tensor's fresh Qt (k x cols at q) from the given stream: N(0, 1) (drawNormal), then
// orthonormalized (drawQ).
void drawNormal(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q);
void drawQ(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q);

// Inputs at or above this magnitude could overflow float32 in P, Q or the output (|P|, |Q| and
// |P Qbar^T| are at most N k sqrt(max(n, m)) max|M|): pass 1 counts them with the non-finite ones,
// so such a call falls back to an exact allreduce on every rank, as a NaN would. factorDtype: the
// type the factors travel in on the host wire: float16 (largest 65504) gives its own, far lower
// bound, so that no factor message overflows to Inf (bfloat16 has float32's range; a device sends
// float16 requests as bfloat16).
float overflowLimit(const TensorPlan& t, int N, lowrankDataType_t factorDtype = lowrankFloat32);

}  // namespace lowrank::phases
