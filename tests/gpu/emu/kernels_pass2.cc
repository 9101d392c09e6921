// The CUDA kernels of kernels/cuda/pass2.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/pass2.cu"
