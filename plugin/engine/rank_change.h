// A tensor's state across a change of its approximation rank (lowrankBufferSetTensors declaring
// an id again with another approxRank, or a checkpoint restored into a declaration of another k;
// docs/design.md, "A tensor's life"). The residual is kept as it is (registry.cc copies it);
// the warm-start Q keeps its columns: cut to the first k, or grown with fresh columns drawn as a
// first Q is, from (seed, id, the tensor's calls), so that every comm rank grows it alike.
#pragma once
#include <cstdint>

#include "engine/engine_config.h"
#include "engine/plan.h"

namespace lowrank {

// Tensor t's Qt (t.k x t.view.cols floats at out) from a Qt made at rank `from` (from x
// t.view.cols floats at qt): its first min(from, t.k) rows (Q's columns) as they are, the others
// those rows of the fresh draw phases::drawNormal(t, cfg, stream) (not orthonormalized: the warm
// start of the next call orthonormalizes the whole Q, the kept columns first, so their span is
// kept). stream: phases::idStream(t.id, the tensor's calls with the next one). Requires t
// compressed, from >= 1.
void fitQ(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, const float* qt, int from,
          float* out);

}  // namespace lowrank
