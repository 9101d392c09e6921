// The communicator behind lowrankComm_t: its configuration, transport, per-buffer states and
// counters. The engine's entry point is allReduce(); the API layer checks arguments before.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <vector>

#include "engine/device_engine.h"
#include "engine/engine_config.h"
#include "engine/host_backend.h"
#include "engine/lifecycle.h"
#include "transport/async_transport.h"

struct lowrankComm {
  lowrank::EngineConfig cfg;
  std::unique_ptr<lowrank::AsyncTransport> transport;
  int rank = 0, nranks = 1;
  void* ncclComm = nullptr;  // ncclComm_t of lowrankCommInitFromNccl / lowrankCommInitNcclRank
  bool ownsNccl = false;     // lowrankCommInitNcclRank: released by deleteComm, after the rest
  // The two backends of engine/lifecycle.h, made at the first host or device buffer. The buffers
  // are declared after them, so destroyed first (a device state before its device comm).
  std::unique_ptr<lowrank::HostBackend> host;
  std::unique_ptr<lowrank::DeviceBackend> device;
  lowrank::BufferRegistry buffers;
  lowrank::Counters counters;     // host and device buffers alike
  std::vector<float> scratchQ;    // a fresh initial Q, while a call draws one

  std::mutex callMu;                 // held by every call; abort waits on it before freeing
  std::atomic<bool> failed{false};   // a collective failed: later calls are refused
  std::string failure;               // why (under callMu)
  std::atomic<bool> aborted{false};
  std::mutex errMu;
  std::string lastError;
};

namespace lowrank {

// Frees `comm` (no call may still run on it): lowrank's own state first (buffer states, backends,
// transport), then, when it owns its NCCL communicator (ownsNccl), that communicator:
// ncclCommAbort if the comm was aborted, else ncclCommDestroy. The one place an owned NCCL
// communicator is let go. Errors: that NCCL call's (nccl::fromNccl); comm is freed regardless.
Status deleteComm(lowrankComm* comm);

// The buffer calls of lowrank.h, arguments already checked, under callMu. setLayout and reset drop
// the buffer's plan and state (the next call plans afresh; the layout survives a reset); release
// drops the buffer's record too. view is zero with planned = 0 for a buffer not planned here.
void setLayout(lowrankComm* comm, const void* buf, Layout layout);
void resetBuffer(lowrankComm* comm, const void* buf);
void releaseBuffer(lowrankComm* comm, const void* buf);
void viewBuffer(lowrankComm* comm, const void* buf, lowrankBufferView_t* view);
// lowrankGetStats: the engine's counters (host and device buffers), the transport's bytes, and
// the state held.
void getStats(lowrankComm* comm, lowrankStats_t* stats);

// The allreduce of lowrank.h, arguments already checked. Chooses exact or compressed, keeps the
// buffer's state. On a transport error the buffer's state is reset and the comm marked failed.
// device: the buffers are device memory (the CUDA backend runs the call on `stream`).
Status allReduce(lowrankComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                 lowrankDataType_t dtype, lowrankRedOp_t op, void* stream, bool device);

}  // namespace lowrank
