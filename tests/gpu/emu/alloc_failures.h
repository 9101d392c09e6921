// Out of device memory on demand (emulation only), for the tests of lowrank's own allocation
// failing: the next `after` device allocations (cudaMalloc, cudaMallocAsync) succeed and every
// later one fails with cudaErrorMemoryAllocation, until called again; -1: none fails (the
// default). Pinned host memory is not affected.
#pragma once

namespace emu {

void failDeviceAllocations(long after);

}  // namespace emu
