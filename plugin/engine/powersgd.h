// One compressed call of a planned buffer: the PowerSGD schedule (Vogels et al. 2019, Algorithm 1,
// with error feedback and warm start), run one phase after another:
//   pass 1 (E += G, P = M Q) -> allreduce #1 (P | exact part | non-finite count)
//   -> orthonormalize P -> pass 2 (Q = M^T P) -> allreduce #2 (Q) -> Qbar = Q / N
//   -> pass 3 (out = s P Qbar^T, E = M - P Qbar^T).
// The non-finite count rides in allreduce #1, so every comm rank takes the same branch.
#pragma once
#include "engine/buffer_state.h"
#include "engine/engine_config.h"
#include "transport/async_transport.h"
#include "transport/transport.h"

namespace lowrank {

struct CompressedResult {
  bool fellBack = false;  // some rank's input was non-finite: the caller must do an exact call
};

// The unpipelined schedule (LOWRANK_PIPELINE=0, or a buffer too small to chunk): two allreduces.
Status runCompressed(BufferState& st, const EngineConfig& cfg, const void* sendbuff, void* recvbuff,
                     lowrankRedOp_t op, Transport& transport, CompressedResult* result);

// The pipelined schedule of a plan with chunks (plan.pipelined), plugin/engine/pipeline.cc:
//   exact part posted first; pass 1 by row blocks, each P chunk posted as soon as computed;
//   each tensor orthonormalized once its last P chunk is reduced; pass 2 by column blocks, each Q
//   chunk posted as soon as computed; then, chunk by chunk as Q arrives, Qbar and pass 3.
// The progress thread of `transport` reduces chunk c while the caller computes chunk c + 1.
Status runPipelined(BufferState& st, const EngineConfig& cfg, const void* sendbuff, void* recvbuff,
                    lowrankRedOp_t op, AsyncTransport& transport, CompressedResult* result);

}  // namespace lowrank
