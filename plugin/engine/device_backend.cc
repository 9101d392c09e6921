#include "engine/device_backend.h"

#include "engine/cuda_loader.h"
#include "engine/phases.h"
#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

// The dtype a device buffer's factors travel in through NCCL: float16 requests travel as bfloat16
// (docs/design.md, "16-bit factors", "On a device"): NCCL sums float16 in float16, whose range
// (65504, normals from 6.1e-5) does not hold factors of any scale, and no scaling that fits
// every step is known before the sum without one more collective; bfloat16 keeps float32's range
// at the same 2 bytes.
int32_t deviceFactorDtype(lowrankDataType_t t) {
  return t == lowrankFloat32 ? lowrankFloat32 : lowrankBfloat16;
}

lowrankCudaBlock_t block(const BlockSpan& s) {
  return {.tensor = s.tensor, .first = s.first, .offset = s.offset, .valid = s.valid, .ld = s.ld,
          .rows = s.rows, .cols = s.cols, .p = s.p, .qt = s.qt, .qld = s.qld, .k = s.k, .pad_ = 0};
}

// The plan as the backend reads it (abi/cuda_backend.h), the one translation of a Plan for the
// device: the description and the arrays it points to, which the backend reads into its launch
// tables at stateCreate (it keeps none of them).
struct CudaPlan {
  std::vector<lowrankCudaTensor_t> tensors;
  std::vector<lowrankCudaBlock_t> rowBlocks, colBlocks;
  std::vector<lowrankCudaChunk_t> pChunks, qChunks;
  lowrankCudaPlan_t desc{};

  CudaPlan(const Plan& pl, const EngineConfig& cfg, int nranks) {
    for (const TensorPlan& t : pl.tensors) {
      lowrankCudaTensor_t c{.offset = t.offset, .numel = t.numel, .compressed = t.compressed};
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
    for (const RowBlock& b : pl.rowBlocks) rowBlocks.push_back(block(rowSpan(pl, b)));
    for (const ColBlock& b : pl.colBlocks) colBlocks.push_back(block(colSpan(pl, b)));
    for (const Chunk& c : pl.pChunks) pChunks.push_back({c.first, c.last, c.offset, c.count});
    for (const Chunk& c : pl.qChunks) qChunks.push_back({c.first, c.last, c.offset, c.count});
    desc = {.count = pl.count, .dtype = pl.dtype, .errorFeedback = cfg.errorFeedback,
            .orthoEpsilon = cfg.orthoEpsilon, .exactElems = pl.exactElems, .pElems = pl.pElems,
            .qElems = pl.qElems, .tensors = tensors.data(), .nTensors = tensors.size(),
            .rowBlocks = rowBlocks.data(), .nRowBlocks = rowBlocks.size(),
            .colBlocks = colBlocks.data(), .nColBlocks = colBlocks.size(),
            .pChunks = pChunks.data(), .nPChunks = pChunks.size(),
            .qChunks = qChunks.data(), .nQChunks = qChunks.size(), .alternate = pl.alternate,
            .factorDtype = deviceFactorDtype(pl.factorDtype)};
  }
};

// A device buffer's state in the backend: destroyed on the device it was made on.
class DeviceState final : public BackendState {
 public:
  DeviceState(const lowrankCudaBackend_t* be, lowrankCudaState_t* s,
              const lowrankCudaMemory_t& memory, bool supplied, int device)
      : be_(be), s_(s), memory_(memory), supplied_(supplied), device_(device) {}
  ~DeviceState() override {
    platform::DeviceGuard guard(device_);
    be_->stateDestroy(s_);
  }
  // lowrankStats_t.stateBytes: the residual, payload and Q twice, as the host's.
  uint64_t bytes() const override { return memory_.residual + memory_.payload + memory_.factors; }
  void memory(lowrankMemoryInfo_t* info) const override {
    info->device = 1;
    info->supplied = supplied_;
    info->residualBytes = memory_.residual;
    info->factorBytes = memory_.factors;
    info->payloadBytes = memory_.payload;
    info->workspaceBytes = memory_.workspace;
    info->tableBytes = memory_.tables;
    info->pinnedBytes = memory_.pinned;
  }
  lowrankCudaState_t* get() const { return s_; }

 private:
  const lowrankCudaBackend_t* be_;
  lowrankCudaState_t* s_;
  lowrankCudaMemory_t memory_;
  bool supplied_;
  int device_;
};

}  // namespace

Status DeviceBackend::create(void* ncclComm, int nranks, const EngineConfig& cfg,
                             std::unique_ptr<DeviceBackend>* out) {
  const lowrankCudaBackend_t* backend = nullptr;
  LR_RETURN_IF_ERROR(loadCudaBackend(&backend));
  std::unique_ptr<DeviceBackend> e(new DeviceBackend(nranks, cfg, backend));
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));
  e->nccl_ = api;
  lowrankCudaError_t err{};
  if (int r = backend->commCreate(api, ncclComm, nranks, cfg.timeoutSec, &e->comm_, &e->device_,
                                  &err))
    return e->fromBackend(r, err);
  LR_INFO("CUDA engine for %d comm ranks on device %d", nranks, e->device_);
  *out = std::move(e);
  return Status::Ok();
}

DeviceBackend::~DeviceBackend() {
  if (!comm_) return;
  // On the engine's device (the backend's streams and handles belong to it), whatever the caller's.
  platform::DeviceGuard guard(device_);
  be_->commDestroy(comm_);
}

void DeviceBackend::abort() { be_->commAbort(comm_); }

Status DeviceBackend::fromBackend(int code, const lowrankCudaError_t& error) {
  if (code == lowrankSuccess) return Status::Ok();
  if (error.ncclResult) {
    ncclFailed_ = true;
    return nccl::fromNccl(*nccl_, error.ncclResult, error.message);
  }
  const lowrankResult_t c = code > lowrankSuccess && code < lowrankNumResults
                                ? lowrankResult_t(code) : lowrankInternalError;
  return Status::Error(c, "%s", error.message);
}

void DeviceBackend::traffic(uint64_t* elements, uint64_t* bytes) const {
  be_->traffic(comm_, elements, bytes);
}

Status DeviceBackend::exact(const Call& c) {
  lowrankCudaError_t err{};
  return fromBackend(
      be_->exactAllReduce(comm_, c.send, c.recv, c.count, c.dtype, c.op, c.stream, &err), err);
}

Status DeviceBackend::agree(uint64_t words[PlanCheck::kWords]) {
  lowrankCudaError_t err{};
  return fromBackend(be_->planCheck(comm_, words, &err), err);
}

std::unique_ptr<BackendState> DeviceBackend::allocate(const Plan& plan, const Call& c,
                                                      const EngineConfig& cfg, std::string* why,
                                                      bool* refused) {
  const CudaPlan cp(plan, cfg_, nranks_);
  const lowrankCudaAllocator_t a{cfg.allocator.alloc, cfg.allocator.free, cfg.allocator.userdata};
  lowrankCudaError_t err{};
  lowrankCudaState_t* s = nullptr;
  lowrankCudaMemory_t memory{};
  const Status st =
      fromBackend(be_->stateCreate(comm_, &cp.desc, &a, c.stream, &s, &memory, &err), err);
  *refused = err.refused != 0;
  if (!st.ok()) {
    *why = st.msg;
    return nullptr;
  }
  return std::make_unique<DeviceState>(be_, s, memory, a.alloc != nullptr, device_);
}

Status DeviceBackend::compressed(BackendState& state, const Plan& plan, const Call& c,
                                 const float* freshQ, bool qStep, bool* fellBack) {
  *fellBack = false;  // a rejection arrives later, through collect()
  lowrankCudaError_t err{};
  return fromBackend(be_->runCompressed(comm_, static_cast<DeviceState&>(state).get(), c.send,
                                        c.recv, c.op, freshQ, plan.alternate && qStep, c.stream,
                                        &err),
                     err);
}

Status DeviceBackend::save(BackendState& state, const Plan&, float* residual, float* qt,
                           float* p) {
  lowrankCudaError_t err{};
  return fromBackend(be_->stateSave(static_cast<DeviceState&>(state).get(), residual, qt, p, &err),
                     err);
}

Status DeviceBackend::load(BackendState& state, const Plan&, const float* residual,
                           const float* qt, const float* p) {
  lowrankCudaError_t err{};
  return fromBackend(be_->stateLoad(static_cast<DeviceState&>(state).get(), residual, qt, p, &err),
                     err);
}

Status DeviceBackend::collect(BackendState& state, const void* buf, int wait, uint64_t* rejected) {
  uint32_t n = 0, opMismatches = 0;
  lowrankCudaError_t err{};
  const Status s = fromBackend(
      be_->collectChecks(static_cast<DeviceState&>(state).get(), wait, &n, &opMismatches, &err), err);
  for (uint32_t i = 0; i < n; ++i)
    LR_INFO("device buffer %p: a call was rejected on the device (%s); its output is NaN", buf,
            i < opMismatches ? "comm ranks used different ops"
                             : "non-finite or huge input on some comm rank");
  *rejected = n;
  return s;
}

}  // namespace lowrank
