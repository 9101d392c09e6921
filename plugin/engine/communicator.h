// The communicator behind lowrankComm_t: its configuration, transport, per-buffer states and
// counters. The engine's entry point is allReduce(); the API layer checks arguments before.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "engine/buffer_state.h"
#include "engine/device_engine.h"
#include "engine/engine_config.h"
#include "transport/async_transport.h"

struct lowrankComm {
  lowrank::EngineConfig cfg;
  std::unique_ptr<lowrank::AsyncTransport> transport;
  lowrank::BufferRegistry buffers;
  int rank = 0, nranks = 1;
  void* ncclComm = nullptr;  // ncclComm_t of lowrankCommInitFromNccl / lowrankCommInitNcclRank
  bool ownsNccl = false;     // lowrankCommInitNcclRank: released by deleteComm, after the rest
  std::unique_ptr<lowrank::DeviceEngine> device;  // made at the first device buffer

  struct Counters {
    uint64_t calls = 0, compressedCalls = 0, fallbackCalls = 0;
    uint64_t compressedElements = 0, exactElements = 0, payloadElements = 0;
  } counters;

  std::mutex callMu;                 // held by every call; abort waits on it before freeing
  std::atomic<bool> failed{false};   // a collective failed: later calls are refused
  std::string failure;               // why (under callMu)
  std::atomic<bool> aborted{false};
  std::mutex errMu;
  std::string lastError;
};

namespace lowrank {

// Frees `comm` (no call may still run on it): lowrank's own state first (device engine, buffer
// states, transport), then, when it owns its NCCL communicator (ownsNccl), that communicator:
// ncclCommAbort if the comm was aborted, else ncclCommDestroy. The one place an owned NCCL
// communicator is let go. Errors: that NCCL call's (nccl::fromNccl); comm is freed regardless.
Status deleteComm(lowrankComm* comm);

// The allreduce of lowrank.h, arguments already checked. Chooses exact or compressed, keeps the
// buffer's state. On a transport error the buffer's state is reset and the comm marked failed.
// device: the buffers are device memory (the CUDA backend runs the call on `stream`).
Status allReduce(lowrankComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                 lowrankDataType_t dtype, lowrankRedOp_t op, void* stream, bool device);

}  // namespace lowrank
