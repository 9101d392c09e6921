#include "engine/engine.h"

#include <cstdio>

#include "kernels/host/powersgd_kernels.h"
#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/ucx/ucx_transport.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

// Releases an NCCL communicator the engine owns: the one place one is let go. Either call frees
// the communicator, so nothing is polled after it (settle's null comm).
Status releaseNccl(void* comm, bool abort) {
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));  // resolved already: the NCCL comm was made through it
  return abort ? nccl::settle(*api, nullptr, api->commAbort(comm), 0, "ncclCommAbort")
               : nccl::settle(*api, nullptr, api->commDestroy(comm), 0, "ncclCommDestroy");
}

}  // namespace

// LOWRANK_HOST_ISA, read by the host kernels at their first call: a bad value, or avx2 on a CPU
// without it, fails the communicator's creation here rather than in a call.
static Status checkHostIsa() {
  host::HostIsa isa;
  return host::hostIsaFromEnv(&isa);
}

Status Engine::overUcx(const EngineConfig& cfg, const lowrankUniqueId& id, int rank, int nranks,
                       std::unique_ptr<Engine>* out) {
  LR_RETURN_IF_ERROR(checkHostIsa());
  std::unique_ptr<Transport> ucx;
  UcxTransportOptions opt;
  opt.cost = cfg.ucxCost;
  opt.algorithm = cfg.ucxAlgorithm;
  opt.tune = cfg.ucxTune;
  opt.probe = cfg.ucxProbe;
  opt.alphaPinned = cfg.ucxAlphaPinned;
  opt.betaPinned = cfg.ucxBetaPinned;
  opt.overheadPinned = cfg.ucxOverheadPinned;
  LR_RETURN_IF_ERROR(createUcxTransport(id, rank, nranks, cfg.timeoutSec, opt, &ucx));
  out->reset(new Engine(cfg, std::make_unique<AsyncTransport>(std::move(ucx)), rank, nranks));
  return Status::Ok();
}

Status Engine::overNccl(const EngineConfig& cfg, void* ncclComm, bool owned,
                        std::unique_ptr<Engine>* out) {
  const nccl::Api* api = nullptr;
  std::unique_ptr<NcclTransport> t;
  Status s = checkHostIsa();
  if (s.ok()) s = nccl::realNccl(&api);
  if (s.ok()) s = NcclTransport::create(api, ncclComm, cfg.timeoutSec, &t);
  if (!s.ok()) {
    if (owned) (void)releaseNccl(ncclComm, /*abort=*/false);  // made for this engine: not left behind
    return s;
  }
  const int rank = t->rank(), nranks = t->size();
  out->reset(new Engine(cfg, std::make_unique<AsyncTransport>(std::move(t)), rank, nranks));
  (*out)->ncclComm_ = ncclComm;
  (*out)->ownsNccl_ = owned;
  return Status::Ok();
}

Engine::~Engine() {
  // Device states and the device comm are freed on the communicator's device.
  platform::DeviceGuard guard(device());
  buffers_ = BufferRegistry();
  device_.reset();
}

Status Engine::close(std::unique_ptr<Engine> engine) {
  // A failed communicator was aborted when it failed (markFailed): its NCCL comm, if lowrank's, is
  // gone, and nothing waits for work that will never end.
  void* owned = engine->ownsNccl_ && !engine->aborted_ ? engine->ncclComm_ : nullptr;
  const Status aborted = engine->ncclAbort_;
  engine.reset();  // buffer states, backends and transport: all of them use the NCCL comm
  return owned ? releaseNccl(owned, /*abort=*/false) : aborted;
}

void Engine::abort() {
  aborted_ = true;
  {
    std::lock_guard<std::mutex> lock(failureMu_);
    if (failure_.empty()) failure_ = "the communicator was aborted";
  }
  failed_ = true;
  // Every wait released and out of NCCL first, then NCCL's abort (issue 26: before, abort waited
  // for a call blocked on the device, which only ncclCommAbort could end).
  transport_->abort();
  std::lock_guard<std::mutex> lock(abortMu_);
  if (device_) device_->abort();
  if (ownsNccl_ && ncclComm_ && !ncclAborted_) {  // once: a failure, then lowrankCommAbort
    ncclAborted_ = true;
    ncclAbort_ = releaseNccl(ncclComm_, /*abort=*/true);
  }
}

// Device buffers: the CUDA backend, made at the first device buffer of the communicator.
Status Engine::deviceAllReduce(const Call& c) {
  if (!ncclComm_)
    return Status::Error(lowrankInvalidUsage,
                         "device buffers need a communicator made by lowrankCommInitFromNccl "
                         "(this one moves host memory only)");
  // CUDA graph capture: a compressed call would change per-buffer state that a replay never sees,
  // so it is refused; an uncompressed call is NCCL's own, which NCCL lets the graph capture.
  if (platform::streamCapturing(c.stream)) {
    if (compresses(cfg_, c.dtype, c.op))
      return Status::Error(lowrankInvalidUsage,
                           "device buffer %p: a compressed allreduce cannot be captured into a "
                           "CUDA graph (its state changes at every call); call it outside the "
                           "graph", c.recv);
    const nccl::Api* api = nullptr;
    LR_RETURN_IF_ERROR(nccl::realNccl(&api));
    return nccl::settle(*api, ncclComm_,
                        api->allReduce(c.send, c.recv, c.count, c.dtype, c.op, ncclComm_, c.stream),
                        cfg_.timeoutSec, "ncclAllReduce (captured)");
  }
  if (!device_) {
    std::unique_ptr<DeviceBackend> made;
    LR_RETURN_IF_ERROR(DeviceBackend::create(ncclComm_, nranks_, cfg_, &made));
    std::lock_guard<std::mutex> lock(abortMu_);  // abort() sees it, or it sees the abort
    if (aborted_) made->abort();
    device_ = std::move(made);
  }
  // Work goes to the communicator's device whatever the calling thread's current device is.
  platform::DeviceGuard guard(device_->device());
  setLogDevice(device_->device());
  buffers_.collectArrived(*device_, counters_);
  return runCall(*device_, buffers_, c, cfg_, rank_, counters_, scratchQ_);
}

Status Engine::allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                         lowrankRedOp_t op, void* stream, bool device) {
  if (failed_) {
    std::lock_guard<std::mutex> lock(failureMu_);
    return Status::Error(lowrankInvalidUsage,
                         "the communicator failed at an earlier call (%s); destroy it "
                         "(lowrankCommDestroy) and make a new one", failure_.c_str());
  }
  const Call c{send, recv, count, dtype, op, stream};
  Status s;
  if (device) {
    s = deviceAllReduce(c);
  } else {
    if (!host_) host_ = std::make_unique<HostBackend>(cfg_, *transport_);
    s = runCall(*host_, buffers_, c, cfg_, rank_, counters_, scratchQ_);
  }
  const BufferBackend* be = device ? static_cast<const BufferBackend*>(device_.get()) : host_.get();
  if (s.ok()) {
    ++counters_.calls;
  } else if (breaks(s) || (be && be->broken())) {
    // (A usage error the transport found midway, such as counts that differ after the plan,
    // breaks the sequence too.) Name the buffer: a rank that skipped a call shows up here as a
    // timeout on the others.
    char what[160];
    snprintf(what, sizeof what, "allreduce of buffer %p (count %zu, %s, %s), call %llu: ", recv,
             count, dtypeName(dtype), opName(op), (unsigned long long)counters_.calls + 1);
    s.msg = what + s.msg;
    markFailed(s.msg);
  }
  return s;
}

void Engine::markFailed(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(failureMu_);
    if (failure_.empty()) failure_ = why;
    failed_ = true;
  }
  // Over NCCL a failed communicator is aborted at once (issue 39): lowrank's own NCCL comm gets
  // ncclCommAbort, which ends its kernels, so the caller's stream, joined behind them, moves on
  // and its next host synchronization returns; never ncclCommDestroy with work pending. Device
  // waits end and never touch NCCL again. (The host path over UCX is left as it was.)
  if (ncclComm_) abort();
}

void Engine::setLayout(const void* buf, Layout layout) {
  platform::DeviceGuard guard(device());
  Buffer& b = buffers_.get(buf);
  // A pending restore stays: restore and layout may come in either order before the first call,
  // which checks the restored state against this layout.
  buffers_.reset(buf, b, counters_, /*keepRestores=*/b.synthetic);
  b.ids = positions(layout.size());
  b.synthetic = true;
  b.declared = false;
  b.layout = std::move(layout);
}

Status Engine::setTensors(const void* buf, Layout layout, TensorIds ids) {
  Buffer& b = buffers_.get(buf);
  if (!b.synthetic && b.ids == ids && b.layout == layout) {  // every step's declaration
    b.declared = true;  // the next call may take these ids where they are
    return Status::Ok();
  }
  // A buffer without ids goes on as its tensors: its state (a pending restore, or the state of
  // its calls) becomes its new ids' states, staged for the next call; a layout that is not the
  // declared one cannot take it, and drops nothing: refused.
  platform::DeviceGuard guard(device());
  SavedTensors t;
  if (b.synthetic && (!b.rec || b.rec->plan.perTensor) &&
      buffers_.save(buf, b, cfg_, rank_, nranks_, &t).ok()) {
    Buffer declared;
    declared.layout = layout;
    declared.ids = ids;
    declared.synthetic = false;
    Status s = byPosition(std::move(t), declared, &t);
    if (!s.ok())
      return Status::Error(s.code,
                           "lowrankBufferSetTensors: buffer %p holds state of its layout, which "
                           "these tensors cannot take (%s); lowrankBufferReset it first to start "
                           "them afresh", buf, s.msg.c_str());
    buffers_.reset(buf, b, counters_);
    buffers_.stage(nullptr, std::move(t));
  } else if (b.synthetic) {
    buffers_.reset(buf, b, counters_);  // a batched buffer's state fits no tensors: it goes
  }
  b.layout = std::move(layout);
  b.ids = std::move(ids);
  b.synthetic = false;
  b.declared = true;
  return Status::Ok();
}

void Engine::reset(const void* buf) {
  platform::DeviceGuard guard(device());
  if (Buffer* b = buffers_.find(buf)) buffers_.reset(buf, *b, counters_);
}

void Engine::setAlternate(const void* buf, int alternate) { buffers_.get(buf).alternate = alternate; }

void Engine::release(const void* buf) {
  platform::DeviceGuard guard(device());
  buffers_.erase(buf, counters_);
}

void Engine::view(const void* buf, lowrankBufferView_t* view) const {
  *view = lowrankBufferView_t{};
  const Buffer* b = buffers_.find(buf);
  if (b && b->rec) describePlan(b->rec->plan, b->rec->calls, view);
}

std::vector<int> Engine::tensorRanks(const void* buf) const {
  std::vector<int> out;
  const Buffer* b = buffers_.find(buf);
  if (b && b->rec)
    for (const TensorPlan& t : b->rec->plan.tensors)
      out.push_back(t.compressed && !b->rec->exactOnly ? t.k : 0);
  return out;
}

namespace {

// Writes the encoding of s to out (*size bytes there; null: the size needed only).
Status writeSaved(const SavedTensors& s, const void* buf, void* out, size_t* size) {
  const size_t need = encodedSize(s);
  if (!out) {  // *size may hold anything: it is only written
    *size = need;
    return Status::Ok();
  }
  const size_t room = *size;
  *size = need;
  if (room < need)
    return Status::Error(lowrankInvalidArgument,
                         "lowrankBufferSaveState: buffer %p needs %zu bytes, %zu given (*size is "
                         "now the size needed)", buf, need, room);
  encode(s, static_cast<uint8_t*>(out));
  return Status::Ok();
}

}  // namespace

Status Engine::saveState(const void* buf, void* out, size_t* size) {
  Status s = saveStateOf(buf, out, size);
  if (breaks(s)) {  // a device wait for the state's copies failed (a dead peer, a timeout)
    char what[96];
    snprintf(what, sizeof what, "lowrankBufferSaveState of buffer %p: ", buf);
    s.msg = what + s.msg;
    markFailed(s.msg);
  }
  return s;
}

Status Engine::saveStateOf(const void* buf, void* out, size_t* size) {
  const Buffer* b = buffers_.find(buf);
  platform::DeviceGuard guard(device());
  const Buffer none;  // never made: nothing to save, said as for a buffer without ids
  SavedTensors s;
  LR_RETURN_IF_ERROR(buffers_.save(buf, b ? *b : none, cfg_, rank_, nranks_, &s));
  return writeSaved(s, buf, out, size);
}

Status Engine::restoreState(const void* buf, const void* bytes, size_t size) {
  Buffer* b = buffers_.find(buf);
  platform::DeviceGuard guard(device());
  SavedTensors t;
  if (formatVersion(bytes, size) == SavedTensors::kFormatVersion) {
    LR_RETURN_IF_ERROR(decode(bytes, size, &t));
    LR_RETURN_IF_ERROR(checkRestore(t, cfg_, rank_, nranks_));
  } else {  // format 1: a buffer without ids, its tensors by position
    SavedState s;
    LR_RETURN_IF_ERROR(decode(bytes, size, &s));
    LR_RETURN_IF_ERROR(checkRestore(s, cfg_, rank_, nranks_, b ? b->layout : std::nullopt));
    LR_RETURN_IF_ERROR(tensorsOf(s, cfg_, &t));
  }
  if (!t.byPosition) {  // per id: for whichever buffer next plans each id
    LR_INFO("state of %zu tensor ids staged for restore at their next call", t.tensors.size());
    buffers_.stage(nullptr, std::move(t));
    return Status::Ok();
  }
  Buffer& r = buffers_.get(buf);
  if (Status s = byPosition(std::move(t), r, &t); !s.ok())
    return Status::Error(s.code, "lowrankBufferRestoreState: %s", s.msg.c_str());
  if (r.synthetic && (r.rec || r.layout)) {  // the check its next plan makes, now: a mismatch
    Layout saved;                              // changes nothing
    for (const SavedTensor& x : t.tensors) saved.push_back(x.shape);
    LR_RETURN_IF_ERROR(sameLayout(saved, r.layout, r.rec ? r.rec->plan.count : 0));
  }
  if (r.synthetic) buffers_.reset(buf, r, counters_);
  LR_INFO("buffer %p: state of call %llu staged for restore at the next call", buf,
          (unsigned long long)(t.tensors.empty() ? 0 : t.tensors[0].calls));
  buffers_.stage(BufferRegistry::space(buf, r), std::move(t));
  return Status::Ok();
}

void Engine::memory(const void* buf, lowrankMemoryInfo_t* info) const {
  buffers_.memory(buf, info);
}

void Engine::stats(lowrankStats_t* stats) {
  if (device_) {  // the device's checks that have arrived count now
    platform::DeviceGuard guard(device_->device());
    buffers_.collectArrived(*device_, counters_);
  }
  const Counters& c = counters_;
  *stats = lowrankStats_t{};
  stats->calls = c.calls;
  stats->compressedCalls = c.compressedCalls;
  stats->fallbackCalls = c.fallbackCalls;
  stats->compressedElements = c.compressedElements;
  stats->exactElements = c.exactElements;
  stats->payloadElements = c.payloadElements;
  const auto& t = transport_->counters();
  stats->elementsSent = t.elementsSent.load();
  stats->bytesSent = t.bytesSent.load();
  if (device_) {  // device buffers' NCCL calls, counted by the backend as they are issued
    uint64_t elements = 0, bytes = 0;
    device_->traffic(&elements, &bytes);
    stats->elementsSent += elements;
    stats->bytesSent += bytes;
  }
  stats->ratio = c.payloadElements
                     ? double(c.compressedElements + c.exactElements) / double(c.payloadElements)
                     : 0.0;
  stats->stateBytes = buffers_.stateBytes();
  stats->buffers = buffers_.held();
  stats->exactOnlyPlans = c.exactOnlyPlans;
  stats->rankChanges = c.rankChanges;
}

}  // namespace lowrank
