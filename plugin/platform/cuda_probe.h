// Questions about CUDA that liblowrank answers without linking or loading any CUDA library: only
// a libcuda.so.1 that the process has already loaded (a CUDA program has; a CPU-only one has not)
// is consulted. Thread-safe.
#pragma once

namespace lowrank::platform {

// True if p is device memory (CU_MEMORYTYPE_DEVICE; managed memory reports it too) of a CUDA
// driver already loaded in this process; false without a driver, for host or unknown pointers.
bool isDevicePointer(const void* p);

}  // namespace lowrank::platform
