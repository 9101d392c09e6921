#include "engine/phases.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/host/orthonormalize.h"
#include "kernels/host/random.h"

namespace lowrank::phases {

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

float overflowLimit(const TensorPlan& t, int N, lowrankDataType_t factorDtype) {
  const double grow = 16.0 * N * t.k * std::sqrt(double(std::max(t.view.rows, t.view.cols)));
  return float((factorDtype == lowrankFloat16 ? 65504.0 : double(FLT_MAX)) / grow);
}

}  // namespace lowrank::phases
