// CPU emulation of <cuda_runtime.h> (see emu.h).
#pragma once
#include "cuda_runtime_api.h"
#include "emu.h"
