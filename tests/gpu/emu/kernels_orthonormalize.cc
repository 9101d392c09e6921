// The CUDA kernels of kernels/cuda/orthonormalize.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/orthonormalize.cu"
