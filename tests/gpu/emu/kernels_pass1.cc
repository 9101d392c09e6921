// The CUDA kernels of kernels/cuda/pass1.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/pass1.cu"
