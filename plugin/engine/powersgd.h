// One compressed call of a planned buffer: the PowerSGD schedule (Vogels et al. 2019, Algorithm 1,
// with error feedback and warm start), run one phase after another:
//   pass 1 (E += G, P = M Q) -> allreduce #1 (P | exact part | non-finite count)
//   -> orthonormalize P -> pass 2 (Q = M^T P) -> allreduce #2 (Q) -> Qbar = Q / N
//   -> pass 3 (out = s P Qbar^T, E = M - P Qbar^T).
// The non-finite count rides in allreduce #1, so every comm rank takes the same branch.
#pragma once
#include "engine/buffer_state.h"
#include "engine/engine_config.h"
#include "transport/transport.h"

namespace lowrank {

struct CompressedResult {
  bool fellBack = false;  // some rank's input was non-finite: the caller must do an exact call
};

Status runCompressed(BufferState& st, const EngineConfig& cfg, const void* sendbuff, void* recvbuff,
                     lowrankRedOp_t op, Transport& transport, CompressedResult* result);

}  // namespace lowrank
