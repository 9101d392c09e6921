// The transport over an application's NCCL communicator (lowrankCommInitFromNccl): every
// allreduce is one in-place ncclAllReduce on the legacy default stream, issued through the real
// library's own symbols (nccl::Api, so an LD_PRELOAD interposer never sees it), then waited for.
//
// Waiting: NCCL queues work on a CUDA stream. When a CUDA runtime is loaded in the process
// (platform::streamQuery, plugin/platform/cuda_probe.h), the call polls the
// null stream on the communicator's device, and ncclCommGetAsyncError beside it, until the work is
// done; that wait is bounded by timeoutSec (lowrankTimeout) and returns promptly after abort().
// Without a CUDA runtime there is nothing asynchronous to wait for (NCCL's test double computes on
// the host and has finished when ncclAllReduce returns; logged once at INFO); a program with only a
// static cudart cannot be waited for either. The ncclAllReduce call itself is NCCL's
// own: NCCL has no timeout of its own there, so a peer that never joins can hold it (NCCL's way out
// is ncclCommAbort by the application, which owns the communicator).
//
// Failure: any error of an NCCL call made for a collective (ncclAllReduce's result, whatever its
// code, ncclInvalidUsage and ncclInvalidArgument included; an asynchronous error; the stream
// query; the timeout) breaks the transport (Transport's record): the comm ranks may be out of step
// on the NCCL communicator, and every later call is refused. Argument errors found before NCCL is
// called (Transport::allreduce) do not.
// The NCCL communicator is not owned: abort() only breaks this transport (a wait in progress
// returns promptly), and destruction leaves the NCCL communicator alone.
// Threads: each call goes out from whichever thread runs the allreduce (the caller or
// AsyncTransport's progress thread), with the communicator's device made current for the call.
// Counters: NCCL does not say what it sent, so each call counts what the ring algorithm sends,
// 2 (N-1)/N x the buffer, in 2 (N-1) messages.
#pragma once
#include <memory>
#include <mutex>

#include "platform/nccl.h"
#include "transport/transport.h"

namespace lowrank {

class NcclTransport final : public Transport {
 public:
  // `comm` is an ncclComm_t; rank and size come from ncclCommUserRank / ncclCommCount.
  // Errors: lowrankInvalidArgument (null api or comm), NCCL's errors (nccl::fromNccl).
  static Status create(const nccl::Api* api, void* comm, double timeoutSec,
                       std::unique_ptr<NcclTransport>* out);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

 private:
  // One in-place ncclAllReduce, waited for.
  // A 16-bit part (16-bit factors) goes as its own ncclAllReduce of bfloat16 or float16, summed
  // by NCCL in that type (Transport::runSplit).
  Status run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
             const Wire& wire) override;
  NcclTransport(const nccl::Api* api, void* comm, int rank, int size, int device, double timeoutSec)
      : api_(api), comm_(comm), rank_(rank), size_(size), device_(device), timeoutSec_(timeoutSec) {}
  Status waitDone();  // the queued ncclAllReduce has finished, failed, timed out or been aborted
  // After abort() returns no poll is inside NCCL, nor starts (the engine may ncclCommAbort next).
  void onAbort() override { std::lock_guard<std::mutex> barrier(pollMu_); }

  const nccl::Api* api_;
  void* comm_;
  int rank_, size_, device_;  // device_: ncclCommCuDevice, -1 if unknown
  double timeoutSec_;
  std::mutex pollMu_;  // ncclCommGetAsyncError against onAbort
};

}  // namespace lowrank
