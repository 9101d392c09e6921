// NcclTransport: argument checks, the failed/aborted state, the NCCL call and the bounded wait.
#include "transport/nccl/nccl_transport.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "transport/reduce.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

// The few CUDA runtime calls the wait needs, found without loading CUDA: in the global scope (a
// program linked with libcudart), else in a libcudart some library already loaded privately
// (RTLD_NOLOAD: never loads one). All null when the process has no CUDA runtime.
struct CudaRuntime {
  int (*streamQuery)(void* stream) = nullptr;  // cudaSuccess 0, cudaErrorNotReady 600
  int (*getDevice)(int* device) = nullptr;
  int (*setDevice)(int device) = nullptr;
};
constexpr int kCudaErrorNotReady = 600;

const CudaRuntime& cudaRuntime() {
  static CudaRuntime rt;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = RTLD_DEFAULT;
    if (!dlsym(h, "cudaStreamQuery")) {
      h = nullptr;
      for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
        if ((h = dlopen(so, RTLD_LAZY | RTLD_NOLOAD))) break;
    }
    if (!h) {
      // The CUDA driver without a runtime we can reach: a program linked with the static cudart.
      if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
        dlclose(driver);
        LR_WARN("NCCL transport: CUDA is in use but no CUDA runtime is reachable (static cudart?); "
                "host-buffer allreduces over NCCL cannot wait for the stream");
      } else {
        LR_INFO("NCCL transport: no CUDA runtime in this process; NCCL calls are taken as synchronous");
      }
      return;
    }
    rt.streamQuery = reinterpret_cast<int (*)(void*)>(dlsym(h, "cudaStreamQuery"));
    rt.getDevice = reinterpret_cast<int (*)(int*)>(dlsym(h, "cudaGetDevice"));
    rt.setDevice = reinterpret_cast<int (*)(int)>(dlsym(h, "cudaSetDevice"));
  });
  return rt;
}

// ncclCommCuDevice is not in nccl::Api (the device engine does not need it); -1 if unavailable.
int commDevice(const nccl::Api& api, void* comm) {
  using Fn = nccl::Result (*)(const void*, int*);
  void* s = dlsym(api.handle, "pncclCommCuDevice");
  if (!s) s = dlsym(api.handle, "ncclCommCuDevice");
  int dev = -1;
  if (!s || reinterpret_cast<Fn>(s)(comm, &dev) != nccl::kSuccess) return -1;
  return dev;
}

// Makes `device` current on this thread, and restores the caller's device after.
class DeviceGuard {
 public:
  DeviceGuard(const CudaRuntime& rt, int device) : rt_(rt) {
    if (device >= 0 && rt.getDevice && rt.setDevice && rt.getDevice(&saved_) == 0 && saved_ != device)
      rt.setDevice(device);
    else
      saved_ = -1;
  }
  ~DeviceGuard() {
    if (saved_ >= 0) rt_.setDevice(saved_);
  }

 private:
  const CudaRuntime& rt_;
  int saved_ = -1;
};

}  // namespace

Status NcclTransport::create(const nccl::Api* api, void* comm, double timeoutSec,
                             std::unique_ptr<NcclTransport>* out) {
  if (!api || !comm || !out)
    return Status::Error(lowrankInvalidArgument, "NcclTransport: null %s",
                         !api ? "NCCL library" : !comm ? "NCCL communicator" : "output");
  int rank = -1, size = 0;
  LR_RETURN_IF_ERROR(nccl::fromNccl(*api, api->commUserRank(comm, &rank), "ncclCommUserRank"));
  LR_RETURN_IF_ERROR(nccl::fromNccl(*api, api->commCount(comm, &size), "ncclCommCount"));
  if (size < 1 || rank < 0 || rank >= size)
    return Status::Error(lowrankInvalidArgument, "NCCL communicator reports comm rank %d of %d", rank, size);
  out->reset(new NcclTransport(api, comm, rank, size, commDevice(*api, comm), timeoutSec));
  LR_INFO("NCCL transport: comm rank %d/%d, device %d", rank, size, (*out)->device_);
  return Status::Ok();
}

Status NcclTransport::failWith(Status s) {
  if (!failed_.load(std::memory_order_acquire)) {
    failure_ = s.msg;
    failed_.store(true, std::memory_order_release);
  }
  return s;
}

Status NcclTransport::waitDone() {
  const CudaRuntime& rt = cudaRuntime();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec_);
  for (;;) {
    nccl::Result async = nccl::kSuccess;
    nccl::Result q = api_->commGetAsyncError(comm_, &async);
    if (q != nccl::kSuccess) return nccl::fromNccl(*api_, q, "ncclCommGetAsyncError");
    if (async != nccl::kSuccess && async != nccl::kInProgress)
      return nccl::fromNccl(*api_, async, "ncclAllReduce (asynchronous error)");
    if (async != nccl::kInProgress) {  // queued (a non-blocking comm says so); now the stream
      if (!rt.streamQuery) return Status::Ok();
      const int e = rt.streamQuery(nullptr);
      if (e == 0) return Status::Ok();
      if (e != kCudaErrorNotReady)
        return Status::Error(lowrankUnhandledCudaError, "nccl allreduce: cudaStreamQuery failed (CUDA error %d)", e);
    }
    if (aborted_)
      return Status::Error(lowrankRemoteError, "nccl allreduce: the communicator was aborted while waiting");
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Error(lowrankTimeout,
                           "nccl allreduce: not done after %g s (LOWRANK_TIMEOUT); the NCCL "
                           "communicator may need ncclCommAbort", timeoutSec_);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status NcclTransport::allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) {
  if (!transport::reductionValid(dtype, op))
    return Status::Error(lowrankInvalidArgument, "nccl allreduce: invalid dtype %d or op %d", int(dtype), int(op));
  const size_t es = dtypeSize(dtype);
  if (count > 0 && !buf) return Status::Error(lowrankInvalidArgument, "nccl allreduce: null buffer");
  if (count > SIZE_MAX / es)
    return Status::Error(lowrankInvalidArgument, "nccl allreduce: count %zu overflows", count);
  if (aborted_) return Status::Error(lowrankInvalidUsage, "nccl allreduce: the communicator was aborted");
  if (failed_.load(std::memory_order_acquire))
    return Status::Error(lowrankInvalidUsage, "nccl allreduce: the communicator failed earlier: %s",
                         failure_.c_str());
  // count 0: NCCL needs no call to keep ranks in step (it has no sequence numbers to keep).
  // One comm rank: the buffer already holds the result (avg over one rank is the identity).
  if (count == 0 || size_ == 1) return Status::Ok();
  LR_TRACE("nccl: comm rank %d: allreduce of %zu %s (%s)", rank_, count, dtypeName(dtype), opName(op));
  // The null stream is the current device's: make it the communicator's for the call and the
  // wait (the progress thread has no device of its own; the caller's is restored).
  DeviceGuard device(cudaRuntime(), device_);
  // lowrank's dtype and op numbers are NCCL's.
  nccl::Result r = api_->allReduce(buf, buf, count, int(dtype), int(op), comm_, nullptr);
  if (r != nccl::kSuccess && r != nccl::kInProgress) return failWith(nccl::fromNccl(*api_, r, "ncclAllReduce"));
  Status st = waitDone();
  if (!st.ok()) return failWith(st);
  // What the ring sends: 2 (N-1) steps of count/N elements (no overflow for any count).
  const uint64_t n = uint64_t(size_), c = count;
  const uint64_t elems = (c / n) * 2 * (n - 1) + (c % n) * 2 * (n - 1) / n;
  counters_.elementsSent.fetch_add(elems, std::memory_order_relaxed);
  counters_.bytesSent.fetch_add(elems * es, std::memory_order_relaxed);
  counters_.messages.fetch_add(2 * (n - 1), std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace lowrank
