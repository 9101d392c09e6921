// Element-wise reductions of every lowrankDataType_t x lowrankRedOp_t, shared by the transports.
// Integers wrap (two's complement) on sum/prod overflow; half/bfloat16 are reduced in float and
// rounded to nearest even after each operation (util/convert.h).
#pragma once
#include <cstddef>

#include "lowrank/lowrank.h"

namespace lowrank::transport {

// dst[i] = dst[i] op src[i] for i < count. lowrankAvg reduces as lowrankSum (see divideBy).
// dtype and op must be valid (the caller checks).
void reduceInto(void* dst, const void* src, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op);

// The last step of lowrankAvg: buf[i] = buf[i] / n. Floats divide in their type (half/bfloat16 via
// float, rounded once); integers divide as C does (truncation toward zero), as ncclAvg does.
void divideBy(void* buf, size_t count, lowrankDataType_t dtype, int n);

// True if dtype and op are inside their enums.
bool reductionValid(lowrankDataType_t dtype, lowrankRedOp_t op);

}  // namespace lowrank::transport
