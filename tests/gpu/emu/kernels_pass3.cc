// The CUDA kernels of kernels/cuda/pass3.cu compiled for the CPU emulation (emu.h).
#include "kernels/cuda/pass3.cu"
