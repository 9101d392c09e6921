// The steps of one compressed call on the host (plugin/engine/pipeline.cc runs them chunk by
// chunk on the blocks of plan.h's rowSpan/colSpan), and the first Q and the op code that host and
// device buffers share.
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/engine_config.h"
#include "engine/host_backend.h"
#include "engine/plan.h"

namespace lowrank::phases {

// The buffers one compressed call works on, as typed pointers.
struct CallBuffers {
  const Plan& pl;
  size_t es;          // bytes per element of the caller's dtype
  const char* send;   // G
  char* recv;         // the output
  float* e;           // E (holds M after pass 1); null without error feedback
  float* pay;         // allreduce #1: exact part | P | non-finite count
  float* p;           // P of every compressed tensor (inside pay)
  float* qt;          // Q^T of every compressed tensor, whole-tensor layout
};
CallBuffers callBuffers(const Plan& pl, HostState& st, const EngineConfig& cfg,
                        const void* sendbuff, void* recvbuff);

// The fresh Qt of every compressed tensor (qt: plan.qElems floats, at each tensor's qOffset), for
// host and device buffers alike: drawn from N(0, 1) with cfg.seed and the tensor's stream
// (qStream), so every comm rank draws the same Q (and a reset buffer the same again), then
// orthonormalized, which keeps P = M Q well scaled without changing its span. tensorCalls[t]:
// tensor t's calls, this one included. Without it the call warm-starts from the last Qbar.
void initialQ(const Plan& pl, const EngineConfig& cfg, const uint64_t* tensorCalls, float* qt);
// The stream of tensor t's fresh Q at its call number `calls`: from its id, so that a tensor draws
// the same Q whatever buffer or position it is in; for a buffer without ids (synthetic ids: the
// positions), (calls << 20) ^ position, the draw of buffers before tensor ids, kept bit for bit.
uint64_t qStream(const Plan& pl, size_t t, uint64_t calls);
uint64_t idStream(uint64_t id, uint64_t calls);
// One compressed tensor's fresh Qt (k x cols at q) from the given stream: N(0, 1) (drawNormal), then
// orthonormalized (drawQ).
void drawNormal(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q);
void drawQ(const TensorPlan& t, const EngineConfig& cfg, uint64_t stream, float* q);

// Packs the exact tensors of G into payload[0, exactElems) as float32; returns their non-finite count.
size_t packExact(const Plan& pl, const void* sendbuff, float* payload);

// Writes the reduced exact part to recvbuff (divided by N for avg), in the buffer's dtype.
void unpackExact(const Plan& pl, const float* payload, void* recvbuff, lowrankRedOp_t op, int N);

// Inputs at or above this magnitude could overflow float32 in P, Q or the output (|P|, |Q| and
// |P Qbar^T| are at most N k sqrt(max(n, m)) max|M|): pass 1 counts them with the non-finite ones,
// so such a call falls back to an exact allreduce on every rank, as a NaN would.
float overflowLimit(const TensorPlan& t, int N);

// The op's code in the payload's op element (abi/cuda_backend.h: lowrankPayloadOpCode, the one
// definition host and device use): summed over N comm ranks it is N times one code only if every
// rank used the same op.
float opCode(lowrankRedOp_t op);

// Sets the two check elements of the payload: the non-finite count and this rank's op.
void setChecks(const Plan& pl, float* payload, size_t nonFinite, lowrankRedOp_t op);
// After allreduce #1: Ok, fellBack (some rank's input was non-finite or huge), or
// lowrankInvalidUsage when the ranks called with different ops (every rank sees the same sums).
Status readChecks(const Plan& pl, const float* payload, lowrankRedOp_t op, int N, bool* fellBack);

}  // namespace lowrank::phases
