// The CUDA kernels of kernels/cuda/exact.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/exact.cu"
