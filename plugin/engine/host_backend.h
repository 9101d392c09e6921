// Host buffers: their state in host memory, and the backend that runs their calls over the
// communicator's transport (a compressed one: engine/host_schedule.h). The buffer's life around
// it is engine/lifecycle.h's.
#pragma once
#include <memory>
#include <vector>

#include "engine/engine_config.h"
#include "engine/lifecycle.h"
#include "transport/async_transport.h"

namespace lowrank {

// A host buffer's state: the residual E (count float32 when error feedback is on), the payload of
// allreduce #1 (exact part | P of every compressed tensor | non-finite count | op), Qt of every
// compressed tensor (after a call: Qbar, the next call's warm start), and the Q wire (Qt by
// column blocks, as the Q chunks travel).
// Alternating with error feedback: ownQ, the last Q step's own Q (Qt layout, rounded as sent),
// and residualPending: that step left E = M and its residual, E -= P^ ownQ^T with P^ in the
// payload's P, to the next P step (alternateStepP's pendingQt); save() takes it on the copy it
// returns, load() starts without one.
// The elements of HostState::ownQ under a plan (allocate and stateBytes alike).
inline size_t ownQElems(const Plan& plan, bool errorFeedback) {
  return plan.alternate && errorFeedback ? plan.qElems : 0;
}

struct HostState final : BackendState {
  std::vector<float> error, payload, qt, qwire, ownQ;
  bool residualPending = false;
  uint64_t bytes() const override {
    return sizeof(float) * (error.capacity() + payload.capacity() + qt.capacity() +
                            qwire.capacity() + ownQ.capacity());
  }
  void memory(lowrankMemoryInfo_t* info) const override {
    info->residualBytes = sizeof(float) * error.capacity();
    info->factorBytes = sizeof(float) * (qt.capacity() + qwire.capacity() + ownQ.capacity());
    info->payloadBytes = sizeof(float) * payload.capacity();
  }
};

class HostBackend final : public BufferBackend {
 public:
  HostBackend(const EngineConfig& cfg, AsyncTransport& transport) : cfg_(cfg), tr_(transport) {}
  Status exact(const Call& c) override;
  Status agree(uint64_t words[PlanCheck::kWords]) override;
  std::unique_ptr<BackendState> allocate(const Plan& plan, const Call& c, const EngineConfig& cfg,
                                         std::string* why, bool* refused) override;
  uint64_t stateBytes(const Plan& plan, bool errorFeedback) const override {  // + HostState::ownQ
    return plan.stateBytes(errorFeedback) + sizeof(float) * ownQElems(plan, errorFeedback);
  }
  Status compressed(BackendState& state, const Plan& plan, const Call& c, const float* freshQ,
                    bool qStep, bool* fellBack) override;
  Status save(BackendState& state, const Plan& plan, float* residual, float* qt,
              float* p) override;
  Status load(BackendState& state, const Plan& plan, const float* residual, const float* qt,
              const float* p) override;
  bool broken() const override { return tr_.broken(); }

 private:
  const EngineConfig& cfg_;
  AsyncTransport& tr_;
};

}  // namespace lowrank
