#include "engine/cuda/cuda_engine.h"

#include <cstring>

#include "engine/cuda/cuda_status.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank::cuda {

Status CudaEngine::create(const DeviceCommDesc& desc, std::unique_ptr<DeviceEngine>* out) {
  std::unique_ptr<CudaEngine> e(new CudaEngine(desc));
  LR_CUDA(cudaGetDevice(&e->device_));
  LR_CUDA(cudaStreamCreateWithFlags(&e->comm_.stream, cudaStreamNonBlocking));
  LR_CUDA(cudaMalloc(reinterpret_cast<void**>(&e->planCheck_), 3 * sizeof(uint64_t)));
  e->comm_.api = desc.nccl;
  e->comm_.comm = desc.ncclComm;
  e->comm_.nranks = desc.nranks;
  LR_INFO("CUDA engine for comm rank %d/%d on device %d", desc.rank, desc.nranks, e->device_);
  *out = std::move(e);
  return Status::Ok();
}

CudaEngine::~CudaEngine() {
  // On the engine's device (cuSOLVER handles and streams belong to it), whatever the caller's is.
  int current = device_;
  const bool switched =
      cudaGetDevice(&current) == cudaSuccess && current != device_ && cudaSetDevice(device_) == cudaSuccess;
  for (auto& kv : buffers_) kv.second.release();  // pending checks are dropped: no one reads the counters
  if (comm_.stream) {
    cudaStreamSynchronize(comm_.stream);
    cudaStreamDestroy(comm_.stream);
  }
  if (planCheck_) cudaFree(planCheck_);
  if (switched) cudaSetDevice(current);
}

Status CudaEngine::exact(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                         lowrankRedOp_t op, cudaStream_t s) {
  LR_RETURN_IF_ERROR(nccl::fromNccl(*comm_.api,
                                    comm_.api->allReduce(send, recv, count, dtype, op, comm_.comm, s),
                                    "ncclAllReduce"));
  counters_.exactElements += count;
  counters_.payloadElements += count;
  return Status::Ok();
}

// As the host engine's planBuffer: plan, allocate, then one small allreduce in which every rank
// shows its plan's hash and whether it could allocate. Blocks the host (once per buffer).
Status CudaEngine::plan(DeviceBuffer& b, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                        const Layout* layout, const void* recv) {
  Plan pl;
  Status s = makePlan(count, dtype, op, layout, desc_.cfg, &pl);
  if (s.ok() && pl.compressedElems && !pl.pipelined) makeChunks(pl, SIZE_MAX / 4);  // one chunk
  bool allocated = false;
  if (s.ok() && pl.compressedElems) {
    allocated = desc_.cfg.testFailAllocRank != desc_.rank &&
                b.allocate(pl, desc_.cfg.errorFeedback, desc_.nranks).ok();
  } else if (s.ok()) {
    allocated = true;  // nothing to compress: no state
  }
  PlanCheck check(s, pl, allocated);
  LR_CUDA(cudaMemcpy(planCheck_, check.words, sizeof check.words, cudaMemcpyHostToDevice));
  LR_RETURN_IF_ERROR(nccl::fromNccl(*comm_.api,
                                    comm_.api->allReduce(planCheck_, planCheck_, 3, lowrankUint64,
                                                         lowrankMax, comm_.comm, comm_.stream),
                                    "ncclAllReduce (plan check)"));
  LR_CUDA(cudaStreamSynchronize(comm_.stream));
  LR_CUDA(cudaMemcpy(check.words, planCheck_, sizeof check.words, cudaMemcpyDeviceToHost));
  bool exactOnly = false;
  if (s.ok()) s = check.read(pl, op, recv, allocated, &exactOnly);
  if (!s.ok() || exactOnly) b.release();
  if (!s.ok()) return s;
  b.exactOnly = exactOnly;
  b.plan = std::move(pl);
  b.planned = true;
  LR_INFO("device buffer %p planned: count %zu %s, %zu tensors, P %zu Q %zu exact %zu, %zu+%zu "
          "chunks, %zu bytes of state",
          recv, count, dtypeName(dtype), b.plan.tensors.size(), b.plan.pElems, b.plan.qElems,
          b.plan.exactElems, b.plan.pChunks.size(), b.plan.qChunks.size(), b.bytes);
  return Status::Ok();
}

void CudaEngine::collectChecks(const void* recv, DeviceBuffer& b, size_t wait) {
  for (size_t n = 0; b.checksPending; ++n) {
    const size_t i = b.checksFirst;
    const cudaError_t r =
        n < wait ? cudaEventSynchronize(b.checksCopied[i]) : cudaEventQuery(b.checksCopied[i]);
    if (r == cudaErrorNotReady) return;
    if (r != cudaSuccess) {  // the device failed: these checks never arrive (the calls say so)
      b.checksPending = 0;
      return;
    }
    b.checksFirst = (i + 1) % DeviceBuffer::kCheckSlots;
    --b.checksPending;
    const float* checks = b.hostChecks + 2 * i;
    if (checks[0] != 0.f || checks[1] != b.expectedOp[i]) {
      ++counters_.fallbackCalls;
      LR_INFO("device buffer %p: a call was rejected on the device (%s); its output is NaN", recv,
              checks[1] != b.expectedOp[i] ? "comm ranks used different ops"
                                           : "non-finite or huge input on some comm rank");
    }
  }
}

void CudaEngine::collectChecks() {
  for (auto& kv : buffers_) collectChecks(kv.first, kv.second, 0);
}

void CudaEngine::releaseState(const void* recv, DeviceBuffer& b) {
  collectChecks(recv, b, SIZE_MAX);
  b.release();
}

Status CudaEngine::allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                             lowrankRedOp_t op, void* stream, const Layout* layout) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Work goes to the communicator's device whatever the calling thread's current device is.
  int current = device_;
  LR_CUDA(cudaGetDevice(&current));
  if (current != device_) LR_CUDA(cudaSetDevice(device_));
  struct Restore {
    int dev;
    bool on;
    ~Restore() { if (on) cudaSetDevice(dev); }
  } restore{current, current != device_};
  setLogDevice(device_);
  // An error left in the runtime's per-thread slot by the application's own calls would surface
  // at our first launch check: clear it, it is not ours.
  (void)cudaGetLastError();
  collectChecks();
  const bool compressible = desc_.cfg.approxRank > 0 && dtypeCompressible(dtype) &&
                            (op == lowrankSum || op == lowrankAvg);
  if (!compressible) return exact(send, recv, count, dtype, op, s);

  DeviceBuffer& b = buffers_[recv];
  if (b.planned && (b.plan.count != count || b.plan.dtype != dtype)) {
    LR_INFO("device buffer %p: count or dtype changed, state reset", recv);
    releaseState(recv, b);
  }
  if (!b.planned) LR_RETURN_IF_ERROR(plan(b, count, dtype, op, layout, recv));
  const bool warmup = b.calls < uint64_t(desc_.cfg.startIter);
  ++b.calls;
  if (b.plan.compressedElems == 0 || warmup || b.exactOnly)
    return exact(send, recv, count, dtype, op, s);

  // This call's checks need a free slot: when every one is pending, wait for the oldest.
  if (b.checksPending == DeviceBuffer::kCheckSlots) collectChecks(recv, b, 1);
  LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));  // the buffer's last call, on whatever stream
  Status st = runCompressedOnDevice(b, desc_.cfg, comm_, send, recv, op, s);
  if (!st.ok()) {
    releaseState(recv, b);  // never keep a half-updated state
    return st;
  }
  ++counters_.compressedCalls;
  counters_.compressedElements += b.plan.compressedElems;
  counters_.exactElements += b.plan.exactElems;
  counters_.payloadElements += b.plan.pElems + b.plan.qElems + b.plan.exactElems;
  return Status::Ok();
}

void CudaEngine::resetBuffer(const void* recv) {
  auto it = buffers_.find(recv);
  if (it != buffers_.end()) releaseState(recv, it->second);
}

void CudaEngine::releaseBuffer(const void* recv) {
  auto it = buffers_.find(recv);
  if (it == buffers_.end()) return;
  releaseState(recv, it->second);
  buffers_.erase(it);
}

bool CudaEngine::view(const void* recv, lowrankBufferView_t* view) {
  auto it = buffers_.find(recv);
  if (it == buffers_.end() || !it->second.planned) return false;
  describePlan(it->second.plan, it->second.calls, view);
  return true;
}

DeviceCounters CudaEngine::counters() {
  collectChecks();
  DeviceCounters c = counters_;
  for (const auto& kv : buffers_) c.stateBytes += kv.second.bytes;
  c.buffers = buffers_.size();
  return c;
}

}  // namespace lowrank::cuda
