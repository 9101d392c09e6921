// The CUDA kernels of kernels/cuda/misc.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/misc.cu"
