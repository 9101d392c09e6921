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

// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors"): one factor allreduce.
// P step (qStep false): Q = the fresh Q given, else the kept Qbar orthonormalized; pass 1 by row
//   blocks (alternateStepP: E += G, P = M Q, E -= P Q^T), each P chunk posted as computed (the
//   exact part and the checks ride as in PowerSGD's allreduce #1); once all are reduced,
//   Pbar = P / N (kept in the payload for the next call) and out = s Pbar Q^T.
// Q step: P = the kept Pbar orthonormalized; pass by column blocks (alternateStepQ: E += G,
//   Q = M^T P; E -= P Q^T is left to the next P step's pass, Q kept as st.ownQ), each Q chunk
//   posted in the Q payload (plan.qPayload: exact part | Q | checks); once reduced, Qbar = Q / N
//   (kept as the next P step's Q) and out = s P Qbar^T.
// Nothing is written to recvbuff before every rank's checks are in (*fellBack as above).
Status runAlternateOnHost(HostState& st, const Plan& pl, const EngineConfig& cfg,
                          const void* sendbuff, void* recvbuff, lowrankRedOp_t op,
                          const float* freshQ, bool qStep, AsyncTransport& tr, bool* fellBack);

// The payload's exact part and checks, for both schedules (the layout: abi/cuda_backend.h).
namespace hostpay {
// Packs the exact tensors of G into payload[0, exactElems) as float32; returns their non-finite count.
size_t packExact(const Plan& pl, const void* sendbuff, float* payload);
// Writes the reduced exact part to recvbuff (divided by N for avg), in the buffer's dtype.
void unpackExact(const Plan& pl, const float* payload, void* recvbuff, lowrankRedOp_t op, int N);
// After the allreduce that carried the checks (at their places in `at`): Ok, fellBack (some
// rank's input was non-finite or huge), or lowrankInvalidUsage when the ranks called with
// different ops (every rank sees the same sums).
Status readChecks(const lowrankPayloadLayout_t& at, const float* payload, lowrankRedOp_t op,
                  int N, bool* fellBack);
}  // namespace hostpay

}  // namespace lowrank
