// The engine of one communicator: it owns the configuration in force, the transport, the backends
// of host and device buffers, every buffer's record and the counters, and the communicator's
// failure. plugin/api only checks arguments, locks, guards exceptions and maps status codes
// around it (plugin/api/comm.h).
// Thread safety: every call but abort() is serialized by the caller (lowrankComm::callMu);
// abort() and failed() may come from any thread at any time.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/device_backend.h"
#include "engine/engine_config.h"
#include "engine/host_backend.h"
#include "engine/lifecycle.h"
#include "lowrank/lowrank.h"
#include "transport/async_transport.h"
#include "util/status.h"

namespace lowrank {

class Engine {
 public:
  // Over UCX, as comm rank `rank` of `nranks`, from a lowrank unique id (lowrankCommInitRank).
  static Status overUcx(const EngineConfig& cfg, const lowrankUniqueId& id, int rank, int nranks,
                        std::unique_ptr<Engine>* out);
  // Over the NCCL communicator `ncclComm` (an ncclComm_t), its rank and size taken from it. owned:
  // the engine releases it (close()), also when this fails.
  static Status overNccl(const EngineConfig& cfg, void* ncclComm, bool owned,
                         std::unique_ptr<Engine>* out);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const EngineConfig& config() const { return cfg_; }
  bool onNccl() const { return ncclComm_ != nullptr; }  // made over an NCCL communicator

  // The allreduce of lowrank.h, arguments checked; device: the buffers are device memory (the CUDA
  // backend runs the call on `stream`). A collective that broke midway fails the communicator:
  // every later call is refused with lowrankInvalidUsage naming the first failure.
  Status allReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                   lowrankRedOp_t op, void* stream, bool device);

  // setLayout and reset drop the buffer's plan and state (the next call plans afresh; the layout
  // survives a reset); release drops its record too. view is zero (planned 0) for a buffer not
  // planned here.
  void setLayout(const void* buf, Layout layout);
  // lowrankBufferSetTensors: declares buf's tensors with their ids (arguments checked); changes no
  // state (the next call takes each id's state, engine/registry.cc), but a buffer that had no
  // ids hands its state to them (staged). Errors: lowrankInvalidUsage when that state does not fit
  // the tensors (nothing changes then).
  Status setTensors(const void* buf, Layout layout, TensorIds ids);
  void reset(const void* buf);
  // lowrankBufferSetAlternate (checked): buf's schedule from its next call, which re-plans it.
  void setAlternate(const void* buf, int alternate);
  void release(const void* buf);
  void view(const void* buf, lowrankBufferView_t* view) const;
  // lowrankBufferGetTensorRanks: each tensor's k in force in buf's plan (0: exact), in layout
  // order; empty when buf has no plan.
  std::vector<int> tensorRanks(const void* buf) const;
  // lowrankBufferSaveState: the bytes of buf's state into out (*size bytes there; null: the size
  // needed only). lowrankBufferRestoreState: checked and staged for buf's next call. The errors
  // of lowrank.h; neither changes anything on error.
  Status saveState(const void* buf, void* out, size_t* size);
  Status restoreState(const void* buf, const void* bytes, size_t size);
  void stats(lowrankStats_t* stats);
  // lowrankCommGetTransportInfo's JSON object (Transport::info). Any thread.
  std::string transportInfo() const { return transport_->info(); }
  // lowrankBufferGetMemory: the fields of *info after `size` (zero for a buffer holding no state).
  void memory(const void* buf, lowrankMemoryInfo_t* info) const;
  // lowrankCommSetAllocator: device buffers planned from now on take their memory from it.
  void setAllocator(const Allocator& a) { cfg_.allocator = a; }
  // The buffer's record, for tests (null: none).
  const Buffer* find(const void* buf) const { return buffers_.find(buf); }

  // Any thread, any time, never waiting for a call: marks the communicator failed, releases every
  // wait (the transport's, the device backend's), then aborts an NCCL communicator it owns
  // (ncclCommAbort), which ends NCCL's kernels; a waiting call returns promptly. An application's
  // NCCL communicator (lowrankCommInitFromNccl) is not aborted: the released waits suffice.
  void abort();
  // Frees the engine's state; then, when it owns its NCCL communicator, releases that one
  // (ncclCommDestroy; after abort() or a failure, which aborted it already, nothing). Errors:
  // abort's ncclCommAbort or that ncclCommDestroy.
  static Status close(std::unique_ptr<Engine> engine);

 private:
  Engine(const EngineConfig& cfg, std::unique_ptr<AsyncTransport> transport, int rank, int nranks)
      : cfg_(cfg), transport_(std::move(transport)), rank_(rank), nranks_(nranks) {}
  Status deviceAllReduce(const Call& c);
  // The communicator's device, current while device states are collected or freed (-1: none).
  int device() const { return device_ ? device_->device() : -1; }

  EngineConfig cfg_;
  std::unique_ptr<AsyncTransport> transport_;
  int rank_, nranks_;
  void* ncclComm_ = nullptr;  // ncclComm_t of lowrankCommInitFromNccl / lowrankCommInitNcclRank
  bool ownsNccl_ = false;     // lowrankCommInitNcclRank: released by close(), after the rest
  // The two backends, made at the first host or device buffer. The buffers are declared after
  // them, so destroyed first (a device state before its device comm).
  std::unique_ptr<HostBackend> host_;
  std::unique_ptr<DeviceBackend> device_;
  BufferRegistry buffers_;
  Counters counters_;            // host and device buffers alike
  std::vector<float> scratchQ_;  // a fresh initial Q, while a call draws one

  // A collective or a device wait that broke midway (a timeout, NCCL's or the transport's error):
  // the ranks may be at different points of the call sequence, so every later call is refused,
  // naming `why` (the first failure). Usage errors are agreed by all ranks and fail nothing.
  static bool breaks(const Status& s) {
    return !s.ok() && !s.agreed && s.code != lowrankInvalidArgument &&
           s.code != lowrankInvalidUsage;
  }
  // Records the first failure; over NCCL also abort()s (issue 39: a failed communicator always
  // aborts what it owns, and its device waits end).
  void markFailed(const std::string& why);
  Status saveStateOf(const void* buf, void* out, size_t* size);  // saveState, before markFailed

  std::atomic<bool> failed_{false}, aborted_{false};
  std::mutex abortMu_;  // abort() against the device backend's creation
  Status ncclAbort_;    // abort()'s ncclCommAbort (under abortMu_)
  bool ncclAborted_ = false;  // that ncclCommAbort was made (under abortMu_)
  mutable std::mutex failureMu_;
  std::string failure_;  // why it failed (the first failure)
};

}  // namespace lowrank
