// CPU emulation of <cuda_bf16.h>: __nv_bfloat16 with the host converters (round to nearest even).
#pragma once
#include "util/convert.h"

struct __nv_bfloat16 {
  uint16_t bits = 0;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return lowrank::host::toFloat(lowrank::host::bf16_t{h.bits});
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{lowrank::host::toBf16(f).bits};
}
