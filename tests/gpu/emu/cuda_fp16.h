// CPU emulation of <cuda_fp16.h>: __half with the host converters (round to nearest even).
#pragma once
#include "util/convert.h"

struct __half {
  uint16_t bits = 0;
};
inline float __half2float(__half h) {
  return lowrank::host::toFloat(lowrank::host::half_t{h.bits});
}
inline __half __float2half_rn(float f) { return __half{lowrank::host::toHalf(f).bits}; }
