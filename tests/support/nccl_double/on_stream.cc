// The NCCL test double built for the CUDA emulation (tests/gpu/emu): a collective is queued on its
// stream and runs there, in order with the kernels around it, when the emulation gets to it, as
// NCCL's kernels run on the GPU; it has not run when the call returns. An error it meets there
// becomes the communicator's asynchronous error (ncclCommGetAsyncError), as in NCCL. After
// ncclCommAbort a queued collective does nothing (the comm is kept for it); while stalled
// (ncclDoubleStallCollectives) it waits behind a gate of the emulation. A dead peer as NCCL shows
// it (issue 39): once a collective met a remote error (a peer gone: ncclRemoteError), the
// comm's later collectives never end, as NCCL's kernels spin, until ncclCommAbort; so a stream
// joined behind them synchronizes only once the comm is aborted.
#include <cuda_runtime_api.h>

#include <cstdio>

#include "double.h"
#include "gpu/emu/host_work.h"

namespace nccl_double {

ncclResult_t onStream(cudaStream_t stream, ncclComm_t comm, const char* what,
                      std::function<ncclResult_t()> run) {
  if (!comm) return run();  // refused at the call, as NCCL does
  // NCCL's kernels go to `stream`, which must be of the comm's device (a GPU refuses the launch).
  if (const int dev = emu::streamDevice(stream); dev != comm->device)
    return fail(ncclUnhandledCudaError, "%s: a stream of device %d for a communicator of device %d "
                "(cudaErrorInvalidResourceHandle)", what, dev, comm->device);
  auto work = [comm, what, run] {
    {
      std::lock_guard<std::mutex> lock(comm->abortMu);  // an aborted comm's lr is gone
      if (comm->aborting) return;
    }
    const ncclResult_t r = run();
    if (r == ncclSuccess) return;
    int none = ncclSuccess;
    comm->asyncError.compare_exchange_strong(none, r);
    std::fprintf(stderr, "NCCL test double: %s failed on its stream: %s\n", what, getLastError(comm));
  };
  auto ended = [comm, stall = stalled()] {  // a dead peer's collective, or one after it
    return comm->aborted.load() ||
           ((!stall || !stalled()) && comm->asyncError.load() != ncclRemoteError);
  };
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capturing);
  const int e = capturing == cudaStreamCaptureStatusNone
                    ? emu::enqueueGatedHostWork(stream, what, ended, work)
                    : emu::enqueueHostWork(stream, what, work);
  if (e) return fail(ncclUnhandledCudaError, "%s: the CUDA emulation did not queue it (CUDA error %d)", what, e);
  return ncclSuccess;
}

}  // namespace nccl_double
