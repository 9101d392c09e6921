// The CUDA kernels of kernels/cuda/tables.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/tables.cu"
