// The emulated runtime's C++ entries (libcuda.so.1 of tests/gpu/emu): queue host work on a
// stream, as a kernel launch or a cudaMemcpyAsync is queued, and which device a stream or a pointer
// belongs to. For the emulated kernels (emu.h),
// cuSOLVER's stand-in and the NCCL test double built for the emulation, which include CUDA's own
// headers or this directory's, so nothing here names a CUDA type but the stream.
#pragma once
#include <cstddef>
#include <functional>

struct CUstream_st;

namespace emu {

// Queues `work` on `stream` (null: the legacy default stream); it runs when something forces it
// (runtime.h), once per graph launch when the stream is being captured. `what` names it in the
// emulation's messages. Returns a cudaError_t value (0: queued).
int enqueueHostWork(CUstream_st* stream, const char* what, std::function<void()> work);
// As enqueueHostWork, but the work cannot run while ready() returns false (called from any thread
// that polls or forces the device, under the emulation's lock): a kernel that never ends, such as
// NCCL's collective waiting for a dead peer, for the tests of bounded waits. Not for capture.
int enqueueGatedHostWork(CUstream_st* stream, const char* what, std::function<bool()> ready,
                         std::function<void()> work);

// The device whose work `stream` carries (null, the legacy stream: the current device's).
int streamDevice(CUstream_st* stream);
// The device of the device memory p points into; -1 for any other pointer (host, pinned, unknown).
int pointerDevice(const void* p);
// Whether a kernel whose parameters are params[0, bytes) may be launched on `stream`: 0, or the
// cudaError_t value a GPU gives (the stream of a device that is not current; a parameter that points
// into another device's memory), with a line on stderr naming it.
int checkKernelLaunch(CUstream_st* stream, const void* params, size_t bytes);

}  // namespace emu
