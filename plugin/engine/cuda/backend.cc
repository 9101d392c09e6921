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
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_schedule.h"
#include "engine/cuda/device_state.h"
#include "engine/cuda/device_wait.h"

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

int commCreate(const lowrankRealNccl_t* nccl, void* ncclComm, int nranks, double timeoutSec,
               lowrankCudaComm_t** out, int* device, lowrankCudaError_t* error) {
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
  const Err s = [&]() -> Err {
    LR_CUDA(cudaGetDevice(&dc.device));
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

void commDestroy(lowrankCudaComm_t* c) {
  if (!c) return;
  DeviceComm& dc = c->dc;
  if (dc.stream && !settleDevice(dc, nullptr, dc.stream)) {
    // A collective that never ends may still use the stream and the plan check's words.
    LR_WARN("CUDA backend: the communication stream did not finish; it is left as it is");
    delete c;
    return;
  }
  if (dc.stream) cudaStreamDestroy(dc.stream);
  if (dc.planCheck) cudaFree(dc.planCheck);
  if (dc.hostPlanCheck) cudaFreeHost(dc.hostPlanCheck);
  delete c;
}

// Any thread: under ncclMu, so that no wait is inside ncclCommGetAsyncError once this returns.
void commAbort(lowrankCudaComm_t* c) {
  if (!c) return;
  std::lock_guard<std::mutex> lock(c->dc.ncclMu);
  c->dc.aborted = true;
}

int planCheck(lowrankCudaComm_t* c, uint64_t* words, lowrankCudaError_t* error) {
  constexpr size_t kBytes = LOWRANK_PLAN_CHECK_WORDS * sizeof(uint64_t);
  const DeviceComm& dc = c->dc;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();  // an error the application left in the runtime is not ours
    // Up, reduced and down in the communication stream's order, through pinned words (a pageable
    // copy may return before its data lands, and the non-blocking stream is not ordered with it).
    std::memcpy(dc.hostPlanCheck, words, kBytes);
    LR_CUDA(cudaMemcpyAsync(dc.planCheck, dc.hostPlanCheck, kBytes, cudaMemcpyHostToDevice, dc.stream));
    LR_TRY(refuseIfAborted(dc, "ncclAllReduce (plan check)"));
    LR_TRY(ncclCall(dc, dc.api->allReduce(dc.planCheck, dc.planCheck, LOWRANK_PLAN_CHECK_WORDS,
                                          lowrankUint64, lowrankMax, dc.comm, dc.stream),
                    "ncclAllReduce (plan check)"));
    LR_CUDA(cudaMemcpyAsync(dc.hostPlanCheck, dc.planCheck, kBytes, cudaMemcpyDeviceToHost, dc.stream));
    LR_TRY(waitDevice(dc, nullptr, dc.stream, "the plan check"));
    std::memcpy(words, dc.hostPlanCheck, kBytes);
    return Err::Ok();
  }();
  return s.report(error);
}

int exactAllReduce(lowrankCudaComm_t* c, const void* send, void* recv, size_t count, int dtype,
                   int op, void* stream, lowrankCudaError_t* error) {
  const DeviceComm& dc = c->dc;
  (void)cudaGetLastError();  // an error the application left in the runtime is not ours
  if (Err a = refuseIfAborted(dc, "ncclAllReduce"); !a.ok()) return a.report(error);
  return ncclCall(dc, dc.api->allReduce(send, recv, count, dtype, op, dc.comm, stream), "ncclAllReduce")
      .report(error);
}

int stateCreate(lowrankCudaComm_t* c, const lowrankCudaPlan_t* plan, lowrankCudaState_t** out,
                uint64_t* bytes, lowrankCudaError_t* error) {
  auto* st = new (std::nothrow) lowrankCudaState();
  if (!st) return Err::Fail(lowrankSystemError, "out of host memory").report(error);
  const Err s = st->b.allocate(*plan, c->dc);  // frees what it allocated on failure
  if (!s.ok()) {
    delete st;
    return s.report(error);
  }
  *out = st;
  *bytes = st->b.bytes;
  return lowrankSuccess;
}

void stateDestroy(lowrankCudaState_t* st) {
  if (!st) return;
  st->b.release();
  delete st;
}

int runCompressed(lowrankCudaComm_t* c, lowrankCudaState_t* st, const void* send, void* recv,
                  int op, const float* freshQ, void* stream, lowrankCudaError_t* error) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DeviceBuffer& b = st->b;
  const Err r = [&]() -> Err {
    // An error left in the runtime's per-thread slot by the application's own calls would
    // surface at our first launch check: clear it, it is not ours.
    (void)cudaGetLastError();
    // Fork: the buffer's stream takes the call from the point the caller's stream has reached
    // (its last call is already before it, in its own order, wherever the ids came from).
    LR_CUDA(cudaEventRecord(b.forked, s));
    LR_CUDA(cudaStreamWaitEvent(b.compute, b.forked, 0));
    const Err run = runCompressedOnDevice(b, c->dc, send, recv, lowrankRedOp_t(op), freshQ, b.compute);
    // Join, once, at the end (also after a failure, so that whatever was queued is ordered
    // before the caller's next work on recv).
    if (!run.ok()) (void)cudaEventRecord(b.done, b.compute);
    LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));
    return run;
  }();
  return r.report(error);
}

// Checkpoint copies: queued on the state's stream after its last call, then one bounded wait (a
// documented synchronous point: the host memory may go when they return).
int stateSave(lowrankCudaState_t* st, float* residual, float* qt, lowrankCudaError_t* error) {
  const DeviceBuffer& b = st->b;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();
    if (residual && b.e)
      LR_CUDA(cudaMemcpyAsync(residual, b.e, b.plan.count * sizeof(float), cudaMemcpyDeviceToHost,
                              b.compute));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpyAsync(qt, b.qt, b.plan.qElems * sizeof(float), cudaMemcpyDeviceToHost,
                              b.compute));
    LR_TRY(waitDevice(*b.comm, nullptr, b.compute, "the state's copies to the host (checkpoint save)"));
    return Err::Ok();
  }();
  return s.report(error);
}

int stateLoad(lowrankCudaState_t* st, const float* residual, const float* qt,
              lowrankCudaError_t* error) {
  DeviceBuffer& b = st->b;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();
    if (residual && b.e)
      LR_CUDA(cudaMemcpyAsync(b.e, residual, b.plan.count * sizeof(float), cudaMemcpyHostToDevice,
                              b.compute));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpyAsync(b.qt, qt, b.plan.qElems * sizeof(float), cudaMemcpyHostToDevice,
                              b.compute));
    LR_TRY(waitDevice(*b.comm, nullptr, b.compute, "the state's copies from the host (checkpoint restore)"));
    return Err::Ok();
  }();
  return s.report(error);
}

int collectChecks(lowrankCudaState_t* st, int wait, uint32_t* rejected, uint32_t* opMismatches,
                  lowrankCudaError_t* error) {
  DeviceBuffer& b = st->b;
  const size_t n = wait == lowrankCudaCollectAll ? SIZE_MAX
                   : wait == lowrankCudaCollectForRoom && b.checksPending == DeviceBuffer::kCheckSlots
                       ? 1
                       : 0;
  return b.collectChecks(n, rejected, opMismatches).report(error);
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
const lowrankCudaBackend_t lowrankCudaBackendV6 = {
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
};
