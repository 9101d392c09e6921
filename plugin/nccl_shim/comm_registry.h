// The shim's record of each NCCL communicator it has seen: the lowrank communicator made over it
// (lazily, at its first eligible call, which is the same call on every comm rank), the sequence
// policy, premulsum ops, layouts applied, and counters for the report line. Keyed by ncclComm_t;
// removed when the communicator is destroyed, finalized or aborted.
#pragma once
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "lowrank/lowrank.h"
#include "nccl_shim/policy.h"

namespace lowrank::shim {

struct ShimComm {
  explicit ShimComm(ncclComm_t c) : nccl(c) {}

  const ncclComm_t nccl;
  int rank = -1, nranks = 0, cudaDev = -1;  // from the real NCCL at creation (-1: unknown)

  // Held by every call on this communicator (NCCL requires them serialized anyway), not by abort.
  std::mutex mu;
  std::atomic<lowrankComm_t> lr{nullptr};
  ncclResult_t initError = ncclSuccess;  // lowrankCommInitFromNccl failed: returned at every call
  std::string initMessage;               // with this text (ncclGetLastError)
  std::atomic<bool> aborted{false};
  SequencePolicy policy;
  std::unordered_map<int, PreMulSum> preMul;          // premulsum ops with a host scalar
  std::unordered_map<const void*, uint64_t> layouts;  // layout version applied, per recvbuff
  lowrankStats_t lastStats{};                         // for the per-call differences

  std::atomic<uint64_t> compressed{0};    // calls lowrank compressed
  std::atomic<uint64_t> exactInLowrank{0};  // calls given to lowrank that it did exactly
  std::atomic<uint64_t> passedThrough{0};   // calls given to the real ncclAllReduce
  std::atomic<int64_t> bytesSaved{0};       // input bytes of compressed calls - bytes of P and Q
};

// The record of `comm`, made if absent (and then the report at exit is armed).
std::shared_ptr<ShimComm> commFor(ncclComm_t comm);
// Asks the real NCCL for the comm rank, size and CUDA device (-1 / 0 while it cannot tell, e.g. a
// non-blocking communicator still forming); the caller holds c.mu or owns c alone.
void queryRanks(ShimComm& c);
// The record of `comm`, or null; `take` removes it from the registry.
std::shared_ptr<ShimComm> findComm(ncclComm_t comm, bool take);
// Every record, e.g. to apply a layout hint.
void forEachComm(const std::function<void(ShimComm&)>& fn);

// "NCCL shim: comm 0x... (comm rank r of n, device d) <when>: N calls compressed, ..." at INFO.
void reportComm(const ShimComm& c, const char* when);

}  // namespace lowrank::shim
