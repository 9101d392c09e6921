// The entry of liblowrank_cuda.so: the plain-C table liblowrank looks up with dlsym
// (abi/cuda_backend.h), over the device state and schedule of this folder. Logging goes through
// liblowrank's services table (abi/services.h): one logging state per process.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "abi/cuda_backend.h"
#include "abi/plugin_log.h"
#include "abi/services.h"
#include "cuda_backend/capture_mode.h"
#include "cuda_backend/cuda_status.h"
#include "cuda_backend/device_scope.h"
#include "cuda_backend/device_schedule.h"
#include "cuda_backend/device_state.h"
#include "cuda_backend/device_wait.h"
#include "util/dtype.h"  // dtypeSize (header only)

struct lowrankCudaComm {
  lowrank::cuda::DeviceComm dc;
};
struct lowrankCudaState {
  lowrank::cuda::DeviceBuffer b;
};

namespace lowrank::plugin {

// liblowrank's services (the library that loaded this one): asked once. Without them the backend
// cannot log; commCreate refuses to start, so this is reached only with them.
const lowrankServices_t& pluginServices() { return servicesOrAbort("liblowrank_cuda"); }

}  // namespace lowrank::plugin

namespace lowrank::cuda {
namespace {

// The NCCL communicator's device (ncclCommCuDevice), taken before anything is made: the calling
// thread's current device may be another (a process that drives several devices; a framework
// that makes a device current per call). Without the entry (optional in the table): the calling
// thread's current device.
Err commDevice(const lowrankRealNccl_t& nccl, void* comm, int* device) {
  if (!nccl.commCuDevice) return fromCuda(cudaGetDevice(device), "cudaGetDevice");
  return fromNccl(nccl.commCuDevice(comm, device), "ncclCommCuDevice");
}

int commCreate(const lowrankRealNccl_t* nccl, void* ncclComm, int nranks, double timeoutSec,
               lowrankCudaComm_t** out, int* device, lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  if (!lowrankGetServices(LOWRANK_SERVICES_VERSION))
    return Err::Fail(lowrankSystemError,
                     "the CUDA backend needs liblowrank's services table version %d, which the "
                     "loaded liblowrank does not serve (a backend from another build?)",
                     LOWRANK_SERVICES_VERSION)
        .report(error);
  auto* c = new (std::nothrow) lowrankCudaComm();
  if (!c) return Err::Fail(lowrankSystemError, "out of host memory").report(error);
  DeviceComm& dc = c->dc;
  dc.api = nccl;
  dc.comm = ncclComm;
  dc.nranks = nranks;
  dc.timeoutSec = timeoutSec;
  dc.device = -1;
  Err s = commDevice(*nccl, ncclComm, &dc.device);
  const DeviceScope on(dc.device);  // everything below is made on the comm's device
  if (s.ok()) s = on.status();
  if (s.ok()) s = [&]() -> Err {
    int pools = 0;  // cudaMallocAsync's memory pools (not on every GPU, driver or MIG set-up)
    dc.asyncAlloc = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dc.device) ==
                        cudaSuccess && pools;
    (void)cudaGetLastError();
    if (!dc.asyncAlloc)
      LR_WARN("CUDA backend: device %d has no memory pools (cudaMallocAsync): buffers planned or "
              "released during training allocate and free synchronously, which waits for the "
              "device", dc.device);
    LR_CUDA(cudaStreamCreateWithFlags(&dc.stream, cudaStreamNonBlocking));
    LR_CUDA(cudaMalloc(reinterpret_cast<void**>(&dc.planCheck),
                       LOWRANK_PLAN_CHECK_WORDS * sizeof(uint64_t)));
    LR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&dc.hostPlanCheck),
                           LOWRANK_PLAN_CHECK_WORDS * sizeof(uint64_t)));
    return Err::Ok();
  }();
  if (!s.ok()) {
    if (dc.stream) cudaStreamDestroy(dc.stream);
    if (dc.planCheck) cudaFree(dc.planCheck);
    if (dc.hostPlanCheck) cudaFreeHost(dc.hostPlanCheck);
    delete c;
    return s.report(error);
  }
  LR_INFO("CUDA backend: communication stream made on device %d for %d comm ranks", dc.device,
          nranks);
  *out = c;
  *device = dc.device;
  return lowrankSuccess;
}

// The communicator's teardown (lowrankCommDestroy: the point where the rest of its memory goes
// back to CUDA, synchronously). Its buffers are gone: their frees are queued behind the
// communication stream, and their pinned blocks back in the pool once the device got there.
// Whatever a collective that never ends may still touch stays allocated.
void commDestroy(lowrankCudaComm_t* c) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  if (!c) return;
  DeviceComm& dc = c->dc;
  const DeviceScope on(dc.device);
  const bool settled = (!dc.stream || settleDevice(dc, nullptr, dc.stream)) &&
                       settleDevice(dc, [&] { return dc.pinned.settled(); });
  if (!settled) {
    LR_WARN("CUDA backend: the communication stream or a buffer's last call did not finish; "
            "their memory is left as it is");
    delete c;
    return;
  }
  if (dc.stream) cudaStreamDestroy(dc.stream);
  if (dc.planCheck) cudaFree(dc.planCheck);
  if (dc.hostPlanCheck) cudaFreeHost(dc.hostPlanCheck);
  dc.pinned.freeAll();
  delete c;
}

// Any thread: under ncclMu, so that no wait is inside ncclCommGetAsyncError once this returns.
void commAbort(lowrankCudaComm_t* c) {
  if (!c) return;
  std::lock_guard<std::mutex> lock(c->dc.ncclMu);
  c->dc.aborted = true;
}

int planCheck(lowrankCudaComm_t* c, uint64_t* words, lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  constexpr size_t kBytes = LOWRANK_PLAN_CHECK_WORDS * sizeof(uint64_t);
  const DeviceComm& dc = c->dc;
  const DeviceScope on(dc.device);
  const Err s = [&]() -> Err {
    LR_TRY(on.status());
    (void)cudaGetLastError();  // an error the application left in the runtime is not ours
    // Up, reduced and down in the communication stream's order, through pinned words (a pageable
    // copy may return before its data lands, and the non-blocking stream is not ordered with it).
    std::memcpy(dc.hostPlanCheck, words, kBytes);
    LR_CUDA(cudaMemcpyAsync(dc.planCheck, dc.hostPlanCheck, kBytes, cudaMemcpyHostToDevice, dc.stream));
    LR_TRY(ncclIssue(dc, "ncclAllReduce (plan check)", [&] {
      return dc.api->allReduce(dc.planCheck, dc.planCheck, LOWRANK_PLAN_CHECK_WORDS, lowrankUint64,
                               lowrankMax, dc.comm, dc.stream);
    }));
    dc.countSent(LOWRANK_PLAN_CHECK_WORDS, sizeof(uint64_t));
    LR_CUDA(cudaMemcpyAsync(dc.hostPlanCheck, dc.planCheck, kBytes, cudaMemcpyDeviceToHost, dc.stream));
    Err waited = waitDevice(dc, nullptr, dc.stream, "the plan check");
    if (waited.code == lowrankTimeout)  // the one wait where a caller's open group shows
      waited.msg += "; a first call inside the caller's ncclGroupStart/ncclGroupEnd waits for a "
                    "collective NCCL holds until ncclGroupEnd: not allowed (lowrank_nccl.h)";
    LR_TRY(waited);
    std::memcpy(words, dc.hostPlanCheck, kBytes);
    return Err::Ok();
  }();
  return s.report(error);
}

int exactAllReduce(lowrankCudaComm_t* c, const void* send, void* recv, size_t count, int dtype,
                   int op, void* stream, lowrankCudaError_t* error) {
  const DeviceComm& dc = c->dc;
  const DeviceScope on(dc.device);
  if (!on.status().ok()) return on.status().report(error);
  (void)cudaGetLastError();  // an error the application left in the runtime is not ours
  const Err s = ncclIssue(dc, "ncclAllReduce", [&] {
    return dc.api->allReduce(send, recv, count, dtype, op, dc.comm, stream);
  });
  if (s.ok()) dc.countSent(count, dtypeSize(dtype));
  return s.report(error);
}

int stateCreate(lowrankCudaComm_t* c, const lowrankCudaPlan_t* plan,
                const lowrankCudaAllocator_t* allocator, void* stream, lowrankCudaState_t** out,
                lowrankCudaMemory_t* memory, lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  const DeviceScope on(c->dc.device);
  if (!on.status().ok()) return on.status().report(error);
  if (plan->factorDtype != lowrankFloat32 && plan->factorDtype != lowrankBfloat16 &&
      plan->factorDtype != lowrankFloat16)
    return Err::Fail(lowrankInvalidArgument, "CUDA backend: factor dtype %d is not float32, "
                     "bfloat16 or float16", int(plan->factorDtype)).report(error);
  auto* st = new (std::nothrow) lowrankCudaState();
  if (!st) return Err::Fail(lowrankSystemError, "out of host memory").report(error);
  const lowrankCudaAllocator_t own{};
  // frees what it allocated on failure
  const Err s = st->b.allocate(*plan, c->dc, allocator ? *allocator : own,
                               static_cast<cudaStream_t>(stream));
  if (!s.ok()) {
    delete st;
    return s.report(error);
  }
  *out = st;
  *memory = st->b.memory;
  return lowrankSuccess;
}

void stateDestroy(lowrankCudaState_t* st) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  if (!st) return;
  const DeviceScope on(st->b.comm ? st->b.comm->device : -1);
  st->b.release();
  delete st;
}

int runCompressed(lowrankCudaComm_t* c, lowrankCudaState_t* st, const void* send, void* recv,
                  int op, const float* freshQ, int qStep, void* stream, lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DeviceBuffer& b = st->b;
  const DeviceScope on(c->dc.device);
  const Err r = [&]() -> Err {
    LR_TRY(on.status());
    // An error left in the runtime's per-thread slot by the application's own calls would
    // surface at our first launch check: clear it, it is not ours.
    (void)cudaGetLastError();
    // Fork: the buffer's stream takes the call from the point the caller's stream has reached
    // (its last call is already before it, in its own order, wherever the ids came from).
    LR_CUDA(cudaEventRecord(b.forked, s));
    LR_CUDA(cudaStreamWaitEvent(b.compute, b.forked, 0));
    const Err run = runCompressedOnDevice(b, c->dc, send, recv, lowrankRedOp_t(op), freshQ,
                                          qStep != 0, b.compute);
    // Join, once, at the end (also after a failure, so that whatever was queued is ordered
    // before the caller's next work on recv).
    if (!run.ok()) (void)cudaEventRecord(b.done, b.compute);
    LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));
    return run;
  }();
  return r.report(error);
}

// Checkpoint copies (a documented synchronous point: the host memory may go when they return):
// a bounded wait for the state's last call first, since a copy to pageable memory blocks the host
// until the stream reaches it, and a copy queued behind a collective that never ends would write
// into host memory freed after a timeout; then the copies, ordered on the state's stream, and
// their own bounded wait.
int stateSave(lowrankCudaState_t* st, float* residual, float* qt, float* p,
              lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  const DeviceBuffer& b = st->b;
  const DeviceScope on(b.comm->device);
  const Err s = [&]() -> Err {
    LR_TRY(on.status());
    (void)cudaGetLastError();
    LR_TRY(waitDevice(*b.comm, b.done, nullptr, "the state's last call (checkpoint save)"));
    if (residual && b.e)
      LR_CUDA(cudaMemcpyAsync(residual, b.e, b.plan.count * sizeof(float), cudaMemcpyDeviceToHost,
                              b.compute));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpyAsync(qt, b.qt, b.plan.qElems * sizeof(float), cudaMemcpyDeviceToHost,
                              b.compute));
    if (p && b.plan.pElems)  // the P area of the payload: an alternating plan's kept P
      LR_CUDA(cudaMemcpyAsync(p, b.payload + b.plan.exactElems, b.plan.pElems * sizeof(float),
                              cudaMemcpyDeviceToHost, b.compute));
    LR_TRY(waitDevice(*b.comm, nullptr, b.compute, "the state's copies to the host (checkpoint save)"));
    return Err::Ok();
  }();
  return s.report(error);
}

int stateLoad(lowrankCudaState_t* st, const float* residual, const float* qt, const float* p,
              lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  DeviceBuffer& b = st->b;
  const DeviceScope on(b.comm->device);
  const Err s = [&]() -> Err {
    LR_TRY(on.status());
    (void)cudaGetLastError();
    LR_TRY(waitDevice(*b.comm, b.done, nullptr, "the state's last call (checkpoint restore)"));
    if (residual && b.e)
      LR_CUDA(cudaMemcpyAsync(b.e, residual, b.plan.count * sizeof(float), cudaMemcpyHostToDevice,
                              b.compute));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpyAsync(b.qt, qt, b.plan.qElems * sizeof(float), cudaMemcpyHostToDevice,
                              b.compute));
    if (p && b.plan.pElems)
      LR_CUDA(cudaMemcpyAsync(b.payload + b.plan.exactElems, p, b.plan.pElems * sizeof(float),
                              cudaMemcpyHostToDevice, b.compute));
    LR_TRY(waitDevice(*b.comm, nullptr, b.compute, "the state's copies from the host (checkpoint restore)"));
    return Err::Ok();
  }();
  return s.report(error);
}

int collectChecks(lowrankCudaState_t* st, int wait, uint32_t* rejected, uint32_t* opMismatches,
                  lowrankCudaError_t* error) {
  const RelaxedCaptureMode relaxed;  // never breaks another thread's capture (capture_mode.h)
  DeviceBuffer& b = st->b;
  const DeviceScope on(b.comm->device);
  if (!on.status().ok()) return on.status().report(error);
  const size_t n = wait == lowrankCudaCollectAll ? SIZE_MAX
                   : wait == lowrankCudaCollectForRoom && b.checksPending == DeviceBuffer::kCheckSlots
                       ? 1
                       : 0;
  return b.collectChecks(n, rejected, opMismatches).report(error);
}

void traffic(lowrankCudaComm_t* c, uint64_t* elements, uint64_t* bytes) {
  *elements = c ? c->dc.elementsSent.load(std::memory_order_relaxed) : 0;
  *bytes = c ? c->dc.bytesSent.load(std::memory_order_relaxed) : 0;
}

}  // namespace
}  // namespace lowrank::cuda

#ifndef CUDART_VERSION  // the CPU emulation of CUDA
#define CUDART_VERSION 0
#endif
#ifndef LOWRANK_CUDA_ARCHS
#define LOWRANK_CUDA_ARCHS "unknown"
#endif
#define LOWRANK_STR2(x) #x
#define LOWRANK_STR(x) LOWRANK_STR2(x)
extern "C" __attribute__((visibility("default")))
const char lowrankCudaBuildInfo[] = "cuda=" LOWRANK_STR(CUDART_VERSION) " arch=" LOWRANK_CUDA_ARCHS
                                    " cudart=static";

extern "C" __attribute__((visibility("default")))
const lowrankCudaBackend_t lowrankCudaBackendV9 = {
    LOWRANK_CUDA_BACKEND_VERSION,
    sizeof(lowrankCudaBackend_t),
    &lowrank::cuda::commCreate,
    &lowrank::cuda::commDestroy,
    &lowrank::cuda::commAbort,
    &lowrank::cuda::planCheck,
    &lowrank::cuda::exactAllReduce,
    &lowrank::cuda::stateCreate,
    &lowrank::cuda::stateDestroy,
    &lowrank::cuda::runCompressed,
    &lowrank::cuda::stateSave,
    &lowrank::cuda::stateLoad,
    &lowrank::cuda::collectChecks,
    &lowrank::cuda::traffic,
};
