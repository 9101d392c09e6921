// The life of a buffer, written once for host and device buffers (docs/design.md, "A tensor's
// life"): whether a call is compressed, the reset on a change of count or dtype, the plan and its
// agreement between comm ranks, warm-up and exact-only buffers, the seed of the first Q, and the
// counters. Where the state lives and how a call runs is a backend's: the host engine
// (host_backend.h) or the CUDA backend (device_backend.h), behind BufferBackend.
// Not thread-safe: a communicator's calls are serialized (lowrankComm::callMu).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/buffer_backend.h"
#include "engine/registry.h"

namespace lowrank {

// True when a call of this dtype and op is compressed under cfg (sum or avg of a floating dtype
// PowerSGD handles, approximation rank > 0).
bool compresses(const EngineConfig& cfg, lowrankDataType_t dtype, lowrankRedOp_t op);

// The state of plan pl (with compressed tensors) for call c, or null with a WARN naming the
// buffer and the bytes it could not get (the backend's failure, or the test hook
// EngineConfig::testFailAllocRank for this comm rank); or null with *refused saying why the
// supplied allocator refused (no WARN: the call fails, agreePlan).
std::unique_ptr<BackendState> allocateState(BufferBackend& be, const Plan& pl, const Call& c,
                                            const EngineConfig& cfg, int rank,
                                            std::optional<std::string>* refused);
// The plan check of a buffer's plan (PlanCheck):
// s is this rank's planning status, restoredId its restore's agreement id (0: none). Collective.
// A plan made exact-only (some comm rank could not allocate) counts in k.exactOnlyPlans, on every
// comm rank. refused: this rank's supplied allocator refused (why), else null. Errors: this
// rank's planning error, or lowrankInvalidUsage when the comm ranks differ; lowrankSystemError
// on every comm rank (Status::agreed) when some rank's supplied allocator refused.
Status agreePlan(BufferBackend& be, const Status& s, const Plan& pl, const Call& c, bool allocated,
                 uint64_t restoredId, uint64_t restoredCalls, bool* exactOnly, Counters& k,
                 const std::optional<std::string>& refused = std::nullopt);
// The INFO line of a record just planned.
void logPlanned(const Call& c, const Record& r);

// One allreduce of buffer b on backend be: exact or compressed, planning, warm-up and counting.
// rank: this comm rank (the test hook that fails its allocations). scratchQ: room for a fresh Q.
// Errors: the backend's; a plan the comm ranks disagree on is lowrankInvalidUsage on every rank.
Status runCall(BufferBackend& be, BufferRegistry& buffers, const Call& c, const EngineConfig& cfg,
               int rank, Counters& k, std::vector<float>& scratchQ);

}  // namespace lowrank
