// The CUDA kernels of kernels/cuda/alternate.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/alternate.cu"
