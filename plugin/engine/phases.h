// The steps of one compressed call that both schedules share (plugin/engine/powersgd.cc runs them
// one after another, plugin/engine/pipeline.cc chunk by chunk), and the sub-views they run on.
#pragma once
#include <cstddef>

#include "engine/buffer_state.h"
#include "engine/engine_config.h"

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
CallBuffers callBuffers(BufferState& st, const EngineConfig& cfg, const void* sendbuff,
                        void* recvbuff);

// Q for this call: drawn from N(0, 1) at the first call (the same seed on every rank; a reset
// buffer draws the same Q again), else the last call's Qbar (warm start); orthonormalized either
// way, which keeps P = M Q well scaled without changing its span.
void prepareQ(BufferState& st, const EngineConfig& cfg);

// Packs the exact tensors of G into payload[0, exactElems) as float32; returns their non-finite count.
size_t packExact(const Plan& pl, const void* sendbuff, float* payload);

// Writes the reduced exact part to recvbuff (divided by N for avg), in the buffer's dtype.
void unpackExact(const Plan& pl, const float* payload, void* recvbuff, lowrankRedOp_t op, int N);

// Inputs at or above this magnitude could overflow float32 in P, Q or the output (|P|, |Q| and
// |P Qbar^T| are at most N k sqrt(max(n, m)) max|M|): pass 1 counts them with the non-finite ones,
// so such a call falls back to an exact allreduce on every rank, as a NaN would.
float overflowLimit(const TensorPlan& t, int N);

// Sets the two check elements of the payload: the non-finite count and this rank's op.
void setChecks(const Plan& pl, float* payload, size_t nonFinite, lowrankRedOp_t op);
// After allreduce #1: Ok, fellBack (some rank's input was non-finite or huge), or
// lowrankInvalidUsage when the ranks called with different ops (every rank sees the same sums).
Status readChecks(const Plan& pl, const float* payload, lowrankRedOp_t op, int N, bool* fellBack);

// Rows [r0, r1) of a tensor's view, as a view of their own (pointers offset by r0 * stride).
host::MatrixView rowBlock(const host::MatrixView& v, size_t r0, size_t r1);
// Columns [c0, c1) of a tensor's view: stride = the full width (pointers offset by c0).
host::MatrixView colBlock(const host::MatrixView& v, size_t c0, size_t c1);

}  // namespace lowrank::phases
