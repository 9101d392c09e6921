// Host buffers: their state in host memory and the PowerSGD schedule that runs a compressed call
// on the CPU (Vogels et al. 2019, Algorithm 1, with error feedback and warm start), over the
// communicator's transport. The buffer's life around it is engine/lifecycle.h's.
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
struct HostState final : BackendState {
  std::vector<float> error, payload, qt, qwire;
  uint64_t bytes() const override {
    return sizeof(float) * (error.capacity() + payload.capacity() + qt.capacity() + qwire.capacity());
  }
  void memory(lowrankMemoryInfo_t* info) const override {
    info->residualBytes = sizeof(float) * error.capacity();
    info->factorBytes = sizeof(float) * (qt.capacity() + qwire.capacity());
    info->payloadBytes = sizeof(float) * payload.capacity();
  }
};

// The one host schedule (plugin/engine/pipeline.cc), chunk by chunk as the plan says (a plan of
// one P chunk and one Q chunk is the unpipelined case):
//   exact part posted first; pass 1 (E += G, P = M Q) by row blocks, each P chunk posted as soon as
//   computed; each tensor's P orthonormalized once its last P chunk is reduced; pass 2 (Q = M^T P)
//   by column blocks, each Q chunk posted as soon as computed; then, chunk by chunk as Q arrives,
//   Qbar = Q / N and pass 3 (out = s P Qbar^T, E = M - P Qbar^T).
// The progress thread of `transport` reduces chunk c while the caller computes chunk c + 1. The
// non-finite count and the op ride in the last P chunk, so every comm rank takes the same branch
// (*fellBack: some rank's input was non-finite; nothing was written to recvbuff).
Status runCompressed(HostState& st, const Plan& pl, const EngineConfig& cfg, const void* sendbuff,
                     void* recvbuff, lowrankRedOp_t op, const float* freshQ, AsyncTransport& tr,
                     bool* fellBack);

class HostBackend final : public BufferBackend {
 public:
  HostBackend(const EngineConfig& cfg, AsyncTransport& transport) : cfg_(cfg), tr_(transport) {}
  Status exact(const Call& c) override;
  Status agree(uint64_t words[PlanCheck::kWords]) override;
  std::unique_ptr<BackendState> allocate(const Plan& plan, const Call& c, const EngineConfig& cfg,
                                         std::string* why, bool* refused) override;
  Status compressed(BackendState& state, const Plan& plan, const Call& c, const float* freshQ,
                    bool* fellBack) override;
  Status save(BackendState& state, const Plan& plan, float* residual, float* qt) override;
  Status load(BackendState& state, const Plan& plan, const float* residual,
              const float* qt) override;
  bool broken() const override { return tr_.broken(); }

 private:
  const EngineConfig& cfg_;
  AsyncTransport& tr_;
};

}  // namespace lowrank
