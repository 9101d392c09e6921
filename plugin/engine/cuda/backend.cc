// The entry of liblowrank_cuda.so: the plain-C table liblowrank looks up with dlsym
// (abi/cuda_backend.h), over the device state and schedule of this folder. Logging goes through
// liblowrank's services table (abi/services.h): one logging state per process.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
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
    return Err::Ok();
  }();
  if (!s.ok()) {
    if (dc.stream) cudaStreamDestroy(dc.stream);
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
  delete c;
}

// Any thread: under ncclMu, so that no wait is inside ncclCommGetAsyncError once this returns.
void commAbort(lowrankCudaComm_t* c) {
  if (!c) return;
  std::lock_guard<std::mutex> lock(c->dc.ncclMu);
  c->dc.aborted = true;
}

int planCheck(lowrankCudaComm_t* c, uint64_t* words, lowrankCudaError_t* error) {
  constexpr size_t kWords = LOWRANK_PLAN_CHECK_WORDS;
  const DeviceComm& dc = c->dc;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();  // an error the application left in the runtime is not ours
    LR_CUDA(cudaMemcpy(dc.planCheck, words, kWords * sizeof(uint64_t), cudaMemcpyHostToDevice));
    LR_TRY(refuseIfAborted(dc, "ncclAllReduce (plan check)"));
    LR_TRY(ncclCall(dc, dc.api->allReduce(dc.planCheck, dc.planCheck, kWords, lowrankUint64, lowrankMax,
                                          dc.comm, dc.stream),
                    "ncclAllReduce (plan check)"));
    LR_TRY(waitDevice(dc, nullptr, dc.stream, "the plan check"));
    LR_CUDA(cudaMemcpy(words, dc.planCheck, kWords * sizeof(uint64_t), cudaMemcpyDeviceToHost));
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
    LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));  // the buffer's last call, on whatever stream
    return runCompressedOnDevice(b, c->dc, send, recv, lowrankRedOp_t(op), freshQ, s);
  }();
  return r.report(error);
}

// Checkpoint copies: after the state's last call (its `done` event, a bounded wait), synchronous,
// so that the host memory may go when they return.
int stateSave(lowrankCudaState_t* st, float* residual, float* qt, lowrankCudaError_t* error) {
  const DeviceBuffer& b = st->b;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();
    LR_TRY(waitDevice(*b.comm, b.done, nullptr, "the state's last call (checkpoint save)"));
    if (residual && b.e)
      LR_CUDA(cudaMemcpy(residual, b.e, b.plan.count * sizeof(float), cudaMemcpyDeviceToHost));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpy(qt, b.qt, b.plan.qElems * sizeof(float), cudaMemcpyDeviceToHost));
    return Err::Ok();
  }();
  return s.report(error);
}

int stateLoad(lowrankCudaState_t* st, const float* residual, const float* qt,
              lowrankCudaError_t* error) {
  DeviceBuffer& b = st->b;
  const Err s = [&]() -> Err {
    (void)cudaGetLastError();
    LR_TRY(waitDevice(*b.comm, b.done, nullptr, "the state's last call (checkpoint restore)"));
    if (residual && b.e)
      LR_CUDA(cudaMemcpy(b.e, residual, b.plan.count * sizeof(float), cudaMemcpyHostToDevice));
    if (b.plan.qElems)
      LR_CUDA(cudaMemcpy(b.qt, qt, b.plan.qElems * sizeof(float), cudaMemcpyHostToDevice));
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
