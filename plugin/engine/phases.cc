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

void initialQ(const Plan& pl, const EngineConfig& cfg, uint64_t calls, float* qt,
              const uint64_t* tensorCalls) {
  for (size_t i = 0; i < pl.tensors.size(); ++i) {
    const TensorPlan& t = pl.tensors[i];
    if (!t.compressed) continue;
    drawQ(t, cfg, tensorCalls ? idStream(t.id, tensorCalls[i]) : (calls << 20) ^ i,
          qt + t.qOffset);
  }
}

float overflowLimit(const TensorPlan& t, int N) {
  const double grow = 16.0 * N * t.k * std::sqrt(double(std::max(t.view.rows, t.view.cols)));
  return float(double(FLT_MAX) / grow);
}

}  // namespace lowrank::phases
