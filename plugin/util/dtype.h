// Element sizes and names of lowrankDataType_t / lowrankRedOp_t.
#pragma once
#include <cstddef>

#include "lowrank/lowrank.h"

namespace lowrank {

// Bytes per element; 0 for a value outside the enum.
inline size_t dtypeSize(lowrankDataType_t t) {
  switch (t) {
    case lowrankInt8: case lowrankUint8: return 1;
    case lowrankFloat16: case lowrankBfloat16: return 2;
    case lowrankInt32: case lowrankUint32: case lowrankFloat32: return 4;
    case lowrankInt64: case lowrankUint64: case lowrankFloat64: return 8;
    default: return 0;
  }
}

const char* dtypeName(lowrankDataType_t t);  // "float", "half", ... as nccl-tests names them
const char* opName(lowrankRedOp_t op);       // "sum", "prod", "max", "min", "avg"

// True for the dtypes PowerSGD compresses (float32, float16, bfloat16).
inline bool dtypeCompressible(lowrankDataType_t t) {
  return t == lowrankFloat32 || t == lowrankFloat16 || t == lowrankBfloat16;
}

}  // namespace lowrank
