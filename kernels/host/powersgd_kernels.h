// The three fused passes of PowerSGD over a gradient matrix, on the host (float32 arithmetic).
// Kernels know nothing of ranks: the engine allreduces P and Q between the passes.
//
// Shapes: the matrix M is n x m, row-major, stored flat; a view may be padded (batched mode):
// only its first `valid` elements exist, the rest count as zeros and are never read or written.
// A view may also be a column block of a wider matrix (ld > cols): the pipelined schedule runs
// pass 2 and 3 by column blocks, each with its own contiguous k x (block width) Qt.
// P is n x k row-major; Q is m x k, stored transposed (Qt: k x m row-major) so that every inner
// loop streams along a row of M. Method: Vogels et al., PowerSGD, NeurIPS 2019, Algorithm 1.
// Memory traffic per float32 element with error feedback: pass 1 reads G, E and writes M (12 B),
// pass 2 reads M (4 B), pass 3 reads M, writes E and the output (12 B): 28 B in all.
// For any k up to 8, pass 3 and the residuals sweep a row once and pass 2 once per 4 factor
// columns, a column's factor values summed in registers, in the same order as one sweep per j.
// Passes 2 and 3 and the residuals run with AVX2 where the CPU has it (HostIsa below), with the
// same bits as the baseline's.
#pragma once
#include <cmath>
#include <cstddef>

#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank::host {

struct MatrixView {
  size_t rows = 0, cols = 0;  // n x m
  size_t valid = 0;           // elements that exist, counted from the start: n*m, or fewer if padded
  size_t ld = 0;              // row stride in the storage; 0 = cols. A column block of a wider
                              // matrix has cols = block width, ld = full width.

  size_t stride() const { return ld ? ld : cols; }
  // Elements of row i that exist (cols, fewer for the last valid row, 0 beyond).
  size_t rowLength(size_t i) const {
    size_t start = i * stride();
    return start >= valid ? 0 : (valid - start < cols ? valid - start : cols);
  }
  // Rows whose every column exists.
  size_t fullRows() const {
    if (valid < cols) return 0;
    size_t f = (valid - cols) / stride() + 1;
    return f < rows ? f : rows;
  }
  // Rows [r0, r0 + n) as a view of their own (its elements start at r0 * stride() of this one's).
  MatrixView rowsFrom(size_t r0, size_t n) const {
    MatrixView s = *this;
    const size_t skip = r0 * stride();
    s.ld = stride();
    s.rows = n;
    s.valid = valid > skip ? valid - skip : 0;
    return s;
  }
};

// Pass 1, fused error-feedback add and P = M Q:
//   M = G + E (E += G in place when e != nullptr, so e then holds M), P = M Q  (P: n x k).
// g has `dtype` (float32, float16 or bfloat16). Returns the number of elements of M that are NaN,
// Inf, or not below `limit` in magnitude (the engine's bound against overflow in P and Q).
size_t errorFeedbackAndP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                         const float* qt, int k, float* p, float limit = INFINITY);

// Pass 2: Q = M^T P  (written as Qt: k x m). M is e when e != nullptr (error feedback), else g.
void computeQ(const void* g, lowrankDataType_t dtype, const float* e, const MatrixView& v,
              const float* p, int k, float* qt);

// Pass 3, fused decompress and error update, with A = P Qbar^T:
//   out = scale * A (cast to dtype; scale 1 for avg, N for sum), and E = M - A when e != nullptr.
// out may alias g (in-place allreduce): each element of g is read before it is written.
void decompressAndUpdateError(float* e, const MatrixView& v, const float* p, const float* qbart,
                              int k, float scale, void* out, lowrankDataType_t dtype);

// Alternating PowerSGD (ACP-SGD; Zhang et al., ICDCS 2023; docs/design.md, "Alternating
// factors"): one factor per call, computed against the kept other one, then the residual of the
// rank's own factors. The P step takes both by blocks of rows kept in cache for the second sweep
// (12 bytes per element of M; after a deferred Q step, k <= 8, one sweep of 4 rows takes the Q
// step's residual, M and the dot products together); the Q step's factor needs every row before
// any residual, so it sweeps M twice (20 bytes), or once (12) when the next P step takes its
// residual (below). The decompression (pass 3 without E) writes 4 more.
// P step (qt: the kept Q, orthonormal, k x cols at stride cols):
//   M = G + E, P = M Q, E = M - P Q^T.
// Q step (p: the kept P, orthonormal, n x k; qt: k x v.cols, written):
//   M = G + E, Q = M^T P, E = M - P Q^T.
// Without E (e null) M is G and no residual is kept. Both return the count of elements of M that
// are NaN, Inf or not below `limit`, as errorFeedbackAndP. wire (16-bit factors, bfloat16 or
// float16): the factor is rounded to it before the residual is taken, as the send will round it,
// so that the residual keeps what the wire drops (with e only; float32: untouched).
// The Q step's residual can be left to the next P step (16 bytes per element over a P and a Q
// step instead of 20): alternateStepQ with deferResidual leaves E = M (and qt rounded to wire),
// and the next alternateStepP, given that step's own Q as pendingQt (k x cols at stride cols) and
// its P in p (the kept P the Q step read), first takes E -= P pendingQt^T tile by tile, with the
// same operations as the Q step's sweep would have (same bits; subtractLowRank below does the
// same for a reader of E in between), then its own step; p is overwritten row by row after its
// rows are read.
size_t alternateStepP(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* qt, int k, float* p, float limit = INFINITY,
                      lowrankDataType_t wire = lowrankFloat32, const float* pendingQt = nullptr);
size_t alternateStepQ(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                      const float* p, int k, float* qt, float limit = INFINITY,
                      lowrankDataType_t wire = lowrankFloat32, bool deferResidual = false);

// E -= P Qt^T over a view (P: rows x k, Qt: k x v.cols at row stride qld), each element
// 0 + p0 q0 + p1 q1 + .. subtracted: the residual of the alternating steps, to the bit.
void subtractLowRank(float* e, const MatrixView& v, const float* p, const float* qt, size_t qld,
                     int k);

// The instruction set of the element-wise passes (pass 2, pass 3, the residuals, the alternating
// Q step's first sweep): the x86-64 baseline (SSE2), or AVX2 where GCC built it and the CPU has it.
// Every output bit is the same with either (docs/design.md, "Host kernels and the instruction
// set"); only time differs. Pass 1 sums across a vector's lanes, so it always runs the baseline's
// code. Thread safety: all of these may be called from any thread; a kernel call reads the choice
// once.
enum class HostIsa { baseline = 0, avx2 = 1 };
const char* hostIsaName(HostIsa isa);
bool hostIsaSupported(HostIsa isa);  // built in, and this CPU (and its OS) runs it
// The choice LOWRANK_HOST_ISA asks for: auto or unset (AVX2 where supported), avx2 (an error where
// not supported), baseline. lowrankInvalidUsage names a bad value.
Status hostIsaFromEnv(HostIsa* out);
HostIsa hostIsa();  // in force: setHostIsa's, else LOWRANK_HOST_ISA's, chosen at the first call
Status setHostIsa(HostIsa isa);  // for tests and benchmarks; lowrankInvalidUsage if unsupported

// Qt *= s, elementwise over k x m (turns the allreduced sum of Q into Qbar).
void scale(float* x, size_t count, float s);

// Counts non-finite elements of a buffer of dtype float32/float16/bfloat16.
size_t countNonFinite(const void* x, size_t count, lowrankDataType_t dtype);

// Converts count elements between float32 and a floating dtype (float32, float16, bfloat16),
// optionally multiplying by s on the way out.
void toFloat32(const void* src, lowrankDataType_t dtype, size_t count, float* dst);
void fromFloat32(const float* src, size_t count, float s, void* dst, lowrankDataType_t dtype);

}  // namespace lowrank::host
