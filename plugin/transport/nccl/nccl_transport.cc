// NcclTransport: the NCCL call and the bounded wait (argument checks and the failure record are
// Transport's).
#include "transport/nccl/nccl_transport.h"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "platform/cuda_probe.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

constexpr int kCudaErrorNotReady = 600;

// The device of an NCCL communicator (ncclCommCuDevice, optional in the table); -1 if unknown.
int commDevice(const nccl::Api& api, void* comm) {
  int dev = -1;
  if (!api.commCuDevice || api.commCuDevice(comm, &dev) != nccl::kSuccess) return -1;
  return dev;
}

}  // namespace

Status NcclTransport::create(const nccl::Api* api, void* comm, double timeoutSec,
                             std::unique_ptr<NcclTransport>* out) {
  if (!api || !comm || !out)
    return Status::Error(lowrankInvalidArgument, "NcclTransport: null %s",
                         !api ? "NCCL library" : !comm ? "NCCL communicator" : "output");
  int rank = -1, size = 0;
  LR_RETURN_IF_ERROR(
      nccl::settle(*api, comm, api->commUserRank(comm, &rank), timeoutSec, "ncclCommUserRank"));
  LR_RETURN_IF_ERROR(
      nccl::settle(*api, comm, api->commCount(comm, &size), timeoutSec, "ncclCommCount"));
  if (size < 1 || rank < 0 || rank >= size)
    return Status::Error(lowrankInvalidArgument, "NCCL communicator reports comm rank %d of %d", rank, size);
  out->reset(new NcclTransport(api, comm, rank, size, commDevice(*api, comm), timeoutSec));
  LR_INFO("NCCL transport: comm rank %d/%d, device %d", rank, size, (*out)->device_);
  return Status::Ok();
}

Status NcclTransport::waitDone() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec_);
  for (;;) {
    nccl::Result async = nccl::kSuccess, q = nccl::kSuccess;
    {
      std::lock_guard<std::mutex> lock(pollMu_);
      if (broken())  // abort() from another thread: the NCCL comm may be gone
        return Status::Error(lowrankRemoteError, "nccl allreduce: aborted while waiting (%s)",
                             failure().c_str());
      q = api_->commGetAsyncError(comm_, &async);
    }
    if (q != nccl::kSuccess) return nccl::fromNccl(*api_, q, "ncclCommGetAsyncError");
    if (async != nccl::kSuccess && async != nccl::kInProgress)
      return nccl::fromNccl(*api_, async, "ncclAllReduce (asynchronous error)");
    if (async != nccl::kInProgress) {  // queued (a non-blocking comm says so); now the stream
      const int e = platform::streamQuery(nullptr);
      if (e == 0) return Status::Ok();
      if (e < 0) {  // no CUDA runtime reachable (none loaded, or a static cudart)
        static std::once_flag once;
        std::call_once(once, [] {
          LR_INFO("NCCL transport: no CUDA runtime reachable in this process; NCCL calls are "
                  "taken as synchronous");
        });
        return Status::Ok();
      }
      if (e != kCudaErrorNotReady)
        return Status::Error(lowrankUnhandledCudaError, "nccl allreduce: cudaStreamQuery failed (CUDA error %d)", e);
    }
    if (broken())  // abort() from another thread
      return Status::Error(lowrankRemoteError, "nccl allreduce: aborted while waiting (%s)",
                           failure().c_str());
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Error(lowrankTimeout,
                           "nccl allreduce: not done after %g s (LOWRANK_TIMEOUT); the NCCL "
                           "communicator may need ncclCommAbort", timeoutSec_);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status NcclTransport::run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                         const Wire& wire) {
  if (wire.active()) return runSplit(buf, count, op, wire);
  // count 0: NCCL needs no call to keep ranks in step (it has no sequence numbers to keep).
  // One comm rank: the buffer already holds the result (avg over one rank is the identity).
  if (count == 0 || size_ == 1) return Status::Ok();
  LR_TRACE("nccl: comm rank %d: allreduce of %zu %s (%s)", rank_, count, dtypeName(dtype), opName(op));
  // The null stream is the current device's: make it the communicator's for the call and the
  // wait (the progress thread has no device of its own; the caller's is restored).
  platform::DeviceGuard device(device_);
  // lowrank's dtype and op numbers are NCCL's.
  // Any error breaks the transport (Transport::allreduce records it), whatever NCCL's code: the
  // other comm ranks may have entered the collective.
  const nccl::Result r = api_->allReduce(buf, buf, count, int(dtype), int(op), comm_, nullptr);
  LR_RETURN_IF_ERROR(nccl::settle(*api_, comm_, r, timeoutSec_, "ncclAllReduce"));
  LR_RETURN_IF_ERROR(waitDone());  // queued: now the stream
  // What the ring sends: 2 (N-1) steps of count/N elements (no overflow for any count).
  const uint64_t n = uint64_t(size_), es = dtypeSize(dtype);
  const uint64_t elems = lowrankNcclRingElements(count, n);
  counters_.elementsSent.fetch_add(elems, std::memory_order_relaxed);
  counters_.bytesSent.fetch_add(elems * es, std::memory_order_relaxed);
  counters_.messages.fetch_add(2 * (n - 1), std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace lowrank
