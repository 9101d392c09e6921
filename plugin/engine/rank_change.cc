#include "engine/rank_change.h"

#include <algorithm>

#include "engine/phases.h"
#include "lowrank/lowrank.h"

namespace lowrank {

void fitQ(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, const float* qt, int from,
          float* out) {
  const size_t cols = t.view.cols, kept = size_t(std::min(from, t.k));
  if (kept < size_t(t.k)) phases::drawNormal(t, cfg, stream, out);  // rows past `kept` stay
  std::copy(qt, qt + kept * cols, out);
}

}  // namespace lowrank
