#include "engine/device_engine.h"

#include <new>

#include "engine/device_backend.h"
#include "engine/phases.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/random.h"
#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

// A plan as the backend reads it (abi/cuda_backend.h): the description and the arrays it points to.
struct CudaPlan {
  std::vector<lowrankCudaTensor_t> tensors;
  std::vector<lowrankCudaRowBlock_t> rowBlocks;
  std::vector<lowrankCudaColBlock_t> colBlocks;
  std::vector<lowrankCudaChunk_t> pChunks, qChunks;
  lowrankCudaPlan_t desc{};

  CudaPlan(const Plan& pl, const EngineConfig& cfg, int nranks) {
    for (const TensorPlan& t : pl.tensors) {
      lowrankCudaTensor_t c{};
      c.offset = t.offset;
      c.numel = t.numel;
      c.compressed = t.compressed;
      if (t.compressed) {
        c.rows = t.view.rows;
        c.cols = t.view.cols;
        c.ld = t.view.stride();
        c.valid = t.view.valid;
        c.k = t.k;
        c.pOffset = t.pOffset;
        c.qOffset = t.qOffset;
        c.lastPChunk = t.lastPChunk;
        c.limit = phases::overflowLimit(t, nranks);
      } else {
        c.exactOffset = t.exactOffset;
      }
      tensors.push_back(c);
    }
    for (const RowBlock& b : pl.rowBlocks) rowBlocks.push_back({b.tensor, b.r0, b.r1});
    for (const ColBlock& b : pl.colBlocks) colBlocks.push_back({b.tensor, b.c0, b.c1, b.wireOffset});
    for (const Chunk& c : pl.pChunks) pChunks.push_back({c.first, c.last, c.offset, c.count});
    for (const Chunk& c : pl.qChunks) qChunks.push_back({c.first, c.last, c.offset, c.count});
    desc.count = pl.count;
    desc.dtype = pl.dtype;
    desc.errorFeedback = cfg.errorFeedback;
    desc.orthoEpsilon = cfg.orthoEpsilon;
    desc.exactElems = pl.exactElems;
    desc.pElems = pl.pElems;
    desc.qElems = pl.qElems;
    desc.tensors = tensors.data();
    desc.nTensors = tensors.size();
    desc.rowBlocks = rowBlocks.data();
    desc.nRowBlocks = rowBlocks.size();
    desc.colBlocks = colBlocks.data();
    desc.nColBlocks = colBlocks.size();
    desc.pChunks = pChunks.data();
    desc.nPChunks = pChunks.size();
    desc.qChunks = qChunks.data();
    desc.nQChunks = qChunks.size();
  }
};

}  // namespace

Status DeviceEngine::create(const DeviceCommDesc& desc, std::unique_ptr<DeviceEngine>* out) {
  const lowrankCudaBackend_t* backend = nullptr;
  LR_RETURN_IF_ERROR(deviceBackend(&backend));
  std::unique_ptr<DeviceEngine> e(new DeviceEngine(desc, backend));
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));
  e->nccl_ = api;
  lowrankCudaError_t err{};
  if (int r = backend->commCreate(api, desc.ncclComm, desc.nranks, &e->comm_, &e->device_, &err))
    return e->fromBackend(r, err);
  LR_INFO("CUDA engine for comm rank %d/%d on device %d", desc.rank, desc.nranks, e->device_);
  *out = std::move(e);
  return Status::Ok();
}

DeviceEngine::~DeviceEngine() {
  if (!comm_) return;
  // On the engine's device (the backend's streams and handles belong to it), whatever the caller's.
  platform::DeviceGuard guard(device_);
  for (auto& kv : buffers_)  // pending checks are dropped: no one reads the counters
    if (kv.second.state) be_->stateDestroy(kv.second.state);
  be_->commDestroy(comm_);
}

Status DeviceEngine::fromBackend(int code, const lowrankCudaError_t& error) const {
  if (code == lowrankSuccess) return Status::Ok();
  if (error.ncclResult) return nccl::fromNccl(*nccl_, error.ncclResult, error.message);
  const lowrankResult_t c = code > lowrankSuccess && code < lowrankNumResults
                                ? lowrankResult_t(code) : lowrankInternalError;
  return Status::Error(c, "%s", error.message);
}

Status DeviceEngine::exact(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                           lowrankRedOp_t op, void* stream) {
  lowrankCudaError_t err{};
  LR_RETURN_IF_ERROR(fromBackend(
      be_->exactAllReduce(comm_, send, recv, count, dtype, op, stream, &err), err));
  counters_.exactElements += count;
  counters_.payloadElements += count;
  return Status::Ok();
}

Status DeviceEngine::allocate(Buffer& b, const Plan& pl) {
  const CudaPlan cp(pl, desc_.cfg, desc_.nranks);
  lowrankCudaError_t err{};
  return fromBackend(be_->stateCreate(comm_, &cp.desc, &b.state, &b.bytes, &err), err);
}

// As the host engine's planBuffer: plan, allocate, then one small allreduce in which every rank
// shows its plan's hash and whether it could allocate. Blocks the host (once per buffer).
Status DeviceEngine::plan(Buffer& b, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                          const Layout* layout, const void* recv) {
  Plan pl;
  Status s = makePlan(count, dtype, op, layout, desc_.cfg, &pl);
  if (s.ok() && pl.compressedElems && !pl.pipelined) makeChunks(pl, SIZE_MAX / 4);  // one chunk
  bool allocated = false;
  if (s.ok() && pl.compressedElems) {
    if (desc_.cfg.testFailAllocRank != desc_.rank) {
      const Status a = allocate(b, pl);
      if (!a.ok()) LR_INFO("device buffer %p: its state could not be allocated: %s", recv, a.msg.c_str());
      allocated = a.ok();
    }
  } else if (s.ok()) {
    allocated = true;  // nothing to compress: no state
  }
  PlanCheck check(s, pl, allocated);
  lowrankCudaError_t err{};
  const Status x = fromBackend(be_->planCheck(comm_, check.words, &err), err);
  bool exactOnly = false;
  if (x.ok() && s.ok()) s = check.read(pl, op, recv, allocated, &exactOnly);
  if (!x.ok() || !s.ok() || exactOnly) releaseState(recv, b);
  if (!x.ok()) return x;
  if (!s.ok()) return s;
  b.exactOnly = exactOnly;
  b.plan = std::move(pl);
  b.planned = true;
  LR_INFO("device buffer %p planned: count %zu %s, %zu tensors, P %zu Q %zu exact %zu, %zu+%zu "
          "chunks, %llu bytes of state",
          recv, count, dtypeName(dtype), b.plan.tensors.size(), b.plan.pElems, b.plan.qElems,
          b.plan.exactElems, b.plan.pChunks.size(), b.plan.qChunks.size(),
          (unsigned long long)b.bytes);
  return Status::Ok();
}

void DeviceEngine::collectChecks(const void* recv, Buffer& b, int wait) {
  if (!b.state) return;
  uint32_t opMismatches = 0;
  const uint32_t rejected = be_->collectChecks(b.state, wait, &opMismatches);
  counters_.fallbackCalls += rejected;
  for (uint32_t i = 0; i < rejected; ++i)
    LR_INFO("device buffer %p: a call was rejected on the device (%s); its output is NaN", recv,
            i < opMismatches ? "comm ranks used different ops"
                             : "non-finite or huge input on some comm rank");
}

void DeviceEngine::collectChecks() {
  for (auto& kv : buffers_) collectChecks(kv.first, kv.second, lowrankCudaCollectArrived);
}

void DeviceEngine::releaseState(const void* recv, Buffer& b) {
  if (b.state) {
    collectChecks(recv, b, lowrankCudaCollectAll);
    be_->stateDestroy(b.state);
  }
  b = Buffer();
}

const float* DeviceEngine::drawQ(Buffer& b) {
  const Plan& pl = b.plan;
  b.freshQ.resize(pl.qElems);
  for (size_t i = 0; i < pl.tensors.size(); ++i) {
    const TensorPlan& t = pl.tensors[i];
    if (!t.compressed) continue;
    float* q = b.freshQ.data() + t.qOffset;
    host::fillNormal(q, size_t(t.k) * t.view.cols, desc_.cfg.seed, (b.calls << 20) ^ i);
    host::orthonormalize(q, t.view.cols, t.k, 1, t.view.cols, desc_.cfg.orthoEpsilon);
  }
  return b.freshQ.data();
}

Status DeviceEngine::allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                               lowrankRedOp_t op, void* stream, const Layout* layout) {
  // Work goes to the communicator's device whatever the calling thread's current device is.
  platform::DeviceGuard guard(device_);
  setLogDevice(device_);
  collectChecks();
  const bool compressible = desc_.cfg.approxRank > 0 && dtypeCompressible(dtype) &&
                            (op == lowrankSum || op == lowrankAvg);
  if (!compressible) return exact(send, recv, count, dtype, op, stream);

  Buffer& b = buffers_[recv];
  if (b.planned && (b.plan.count != count || b.plan.dtype != dtype)) {
    LR_INFO("device buffer %p: count or dtype changed, state reset", recv);
    releaseState(recv, b);
  }
  if (!b.planned) LR_RETURN_IF_ERROR(plan(b, count, dtype, op, layout, recv));
  const bool warmup = b.calls < uint64_t(desc_.cfg.startIter);
  ++b.calls;
  if (b.plan.compressedElems == 0 || warmup || b.exactOnly)
    return exact(send, recv, count, dtype, op, stream);

  // This call's checks need a free slot: when every one is pending, wait for the oldest.
  collectChecks(recv, b, lowrankCudaCollectForRoom);
  const float* freshQ = b.haveQ && desc_.cfg.warmStart ? nullptr : drawQ(b);
  lowrankCudaError_t err{};
  Status st = fromBackend(be_->runCompressed(comm_, b.state, send, recv, op, freshQ, stream, &err), err);
  if (!st.ok()) {
    releaseState(recv, b);  // never keep a half-updated state
    return st;
  }
  b.haveQ = true;
  ++counters_.compressedCalls;
  counters_.compressedElements += b.plan.compressedElems;
  counters_.exactElements += b.plan.exactElems;
  counters_.payloadElements += b.plan.pElems + b.plan.qElems + b.plan.exactElems;
  return Status::Ok();
}

void DeviceEngine::resetBuffer(const void* recv) {
  auto it = buffers_.find(recv);
  if (it == buffers_.end()) return;
  platform::DeviceGuard guard(device_);
  releaseState(recv, it->second);
}

void DeviceEngine::releaseBuffer(const void* recv) {
  auto it = buffers_.find(recv);
  if (it == buffers_.end()) return;
  platform::DeviceGuard guard(device_);
  releaseState(recv, it->second);
  buffers_.erase(it);
}

bool DeviceEngine::view(const void* recv, lowrankBufferView_t* view) {
  auto it = buffers_.find(recv);
  if (it == buffers_.end() || !it->second.planned) return false;
  describePlan(it->second.plan, it->second.calls, view);
  return true;
}

DeviceCounters DeviceEngine::counters() {
  collectChecks();
  DeviceCounters c = counters_;
  for (const auto& kv : buffers_) c.stateBytes += kv.second.bytes;
  c.buffers = buffers_.size();
  return c;
}

}  // namespace lowrank
