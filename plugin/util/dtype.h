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

// The same for a number that may lie outside the enum (an NCCL caller's ncclDataType_t): checked
// as an int before it is read as the enum.
inline size_t dtypeSize(int t) {
  return t >= 0 && t < lowrankNumTypes ? dtypeSize(lowrankDataType_t(t)) : 0;
}

// Mantissa bits of a floating dtype (10 half, 7 bfloat16, 23 float, 52 double), 0 for others.
inline int dtypeMantissaBits(int t) {
  switch (t) {
    case lowrankFloat16: return 10;
    case lowrankBfloat16: return 7;
    case lowrankFloat32: return 23;
    case lowrankFloat64: return 52;
    default: return 0;
  }
}

const char* dtypeName(lowrankDataType_t t);  // "float", "half", ... as nccl-tests names them
const char* opName(lowrankRedOp_t op);       // "sum", "prod", "max", "min", "avg"

// "fp32", "bf16", "fp16": LOWRANK_FACTOR_DTYPE's words for the dtypes factors travel in
// (lowrankConfig_t.factorDtype); "?" for others.
inline const char* factorDtypeName(lowrankDataType_t t) {
  return t == lowrankBfloat16 ? "bf16" : t == lowrankFloat16 ? "fp16" : t == lowrankFloat32 ? "fp32" : "?";
}

// True for the dtypes PowerSGD compresses (float32, float16, bfloat16).
inline bool dtypeCompressible(int t) {
  return t == lowrankFloat32 || t == lowrankFloat16 || t == lowrankBfloat16;
}

}  // namespace lowrank
