// The PowerSGD schedule of a host buffer's compressed call on the CPU (Vogels et al. 2019,
// Algorithm 1, with error feedback and warm start), over the communicator's transport; its twin on
// the device is plugin/cuda_backend/device_schedule.h (where they differ, and why: docs/design.md,
// "Host and device schedules").
#pragma once
#include "engine/engine_config.h"
#include "engine/host_backend.h"
#include "engine/plan.h"
#include "transport/async_transport.h"

namespace lowrank {

// Chunk by chunk as the plan says (a plan of one P chunk and one Q chunk is the unpipelined case):
//   exact part posted first (with one P chunk, in that chunk's allreduce); pass 1 (E += G, P = M Q)
//   by row blocks, each P chunk posted as soon as computed; each tensor's P orthonormalized once
//   its last P chunk is reduced; pass 2 (Q = M^T P) by column blocks, each Q chunk posted as soon
//   as computed; then, chunk by chunk as Q arrives, Qbar = Q / N and pass 3 (out = s P Qbar^T,
//   E = M - P Qbar^T).
// The progress thread of `tr` reduces chunk c while the caller computes chunk c + 1. The
// non-finite count and the op ride in the last P chunk, so every comm rank takes the same branch
// (*fellBack: some rank's input was non-finite; nothing was written to recvbuff).
Status runCompressedOnHost(HostState& st, const Plan& pl, const EngineConfig& cfg,
                           const void* sendbuff, void* recvbuff, lowrankRedOp_t op,
                           const float* freshQ, AsyncTransport& tr, bool* fellBack);

}  // namespace lowrank
