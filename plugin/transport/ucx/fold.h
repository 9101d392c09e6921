// The pieces recursive doubling and halving + doubling share: combining two partners' data in one
// order on both sides, and the fold of a world that is not a power of two (blocks.h, Fold).
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/ucx/algorithms.h"
#include "transport/ucx/blocks.h"

namespace lowrank::ucx {

// mine = lower op higher, elementwise over count elements, where mine is the lower comm rank's data
// when mineIsLower (theirs otherwise). Both partners of a pair get the same bits even where the
// operation is not symmetric bit for bit (the NaN an operation keeps, max(+0, -0)). theirs is
// clobbered when !mineIsLower.
void combineInOrder(void* mine, void* theirs, bool mineIsLower, size_t count, const AllreduceArgs& a);

// Message `index`: an extra comm rank sends its buffer to its partner, which combines it into its
// own (the extra rank, the lower, first). scratch: count * elemSize bytes. Nothing for other ranks.
Status foldIn(Exchange& ex, const Fold& f, const AllreduceArgs& a, std::byte* scratch, uint32_t index);

// Message `index`: the partner sends the result back to its extra comm rank.
Status foldOut(Exchange& ex, const Fold& f, const AllreduceArgs& a, uint32_t index);

}  // namespace lowrank::ucx
