// The PowerSGD passes as CUDA kernels: the device twins of kernels/host (each is held equal to its
// host twin by tests/gpu). Kernels know nothing of ranks or NCCL: the CUDA library
// (plugin/cuda_backend) allreduces P and Q between the launches.
//
// Batched: one launch covers many blocks of many tensors of different shapes, described by a
// table uploaded once when a buffer's plan is made. A block is a piece of one compressed tensor's
// matrix M (n x m, row-major, row stride ld): a row block for pass 1, a column block for passes 2
// and 3. Element (i, j) of a block is at buffer element offset + i*ld + j and exists iff
// i*ld + j < valid (a padded batched view: the missing elements count as zeros and are never read
// or written). P is n x k row-major; Q is kept transposed (Qt: k x m), as on the host.
// dtypes: G and out are float32, float16 or bfloat16; E, P, Q and all accumulation are float32.
// Memory traffic per element (float32, error feedback): pass 1 12 B, pass 2 4 B, pass 3 12 B.
// All launches are asynchronous on `stream` and return the launch error (cudaSuccess if none).
// Thread safety: tables are immutable after creation and may be used from any thread; but a
// BlockTable or OrthoTable holds a workspace (partial sums), so launches that use the same table
// must be ordered (one stream, or chained by events).
// Method: Vogels et al., PowerSGD, NeurIPS 2019, Algorithm 1.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lowrank/lowrank.h"

namespace lowrank::cuda {

struct BlockDesc {
  uint64_t offset = 0;  // element (0, 0) of the block in G / E / out, in elements
  uint64_t valid = 0;   // elements that exist, counted from `offset` (see above)
  uint64_t ld = 0;      // row stride of the tensor's matrix, in elements
  uint32_t rows = 0, cols = 0;
  uint32_t k = 0;       // approximation rank of the tensor, >= 1 (any k; k <= 32 is the fast path)
  uint64_t p = 0;       // index in the P array of the block's first row of P (row stride k)
  uint64_t qt = 0;      // index in the Qt array of the block's Qt: k x cols, row stride qld
  uint64_t qld = 0;
  float limit = 0;      // pass 1: |M| >= limit counts as non-finite (overflow bound), as the host
                        // (0 counts every element: INFINITY for no bound)
};

// A contiguous run of exact (uncompressed) elements: buffer[offset, offset + numel) <-> payload
// [exactOffset, exactOffset + numel) as float32.
struct ExactDesc {
  uint64_t offset = 0, numel = 0, exactOffset = 0;
};

// A tall-skinny n x k matrix to orthonormalize; element (r, j) at base[offset + r*rowStride +
// j*colStride] (P: rowStride k, colStride 1; Qt: rowStride 1, colStride m).
struct OrthoDesc {
  uint64_t offset = 0;
  uint64_t n = 0;
  uint32_t k = 0;
  uint64_t rowStride = 0, colStride = 0;
};

// Device copies of the descriptor tables (and any workspace the kernels need). Created at plan
// time, destroyed with the buffer's state. `stream` null: allocated and uploaded synchronously
// (cudaMalloc, cudaMemcpy from pageable memory; destroy then cudaFree's, which synchronizes the
// device). A stream: stream-ordered on it (cudaMallocAsync, cudaMemcpyAsync from pageable memory,
// which stages its source before it returns; destroy then cudaFreeAsync's on that stream, which
// must still exist): no synchronizing call (the CUDA backend's training path, issue 39).
// `mem` (may be null): where the device memory comes from and what it took. An allocator given
// (lowrankCommSetAllocator's alloc and free): every byte from it (alloc gets allocator.stream; a
// refusal is cudaErrorMemoryAllocation with mem->refused set), given back by destroy through its
// free with the table's stream; else CUDA's, as above. The bytes taken are added up in
// mem->tables (descriptors, prefix arrays) and mem->workspace (partial sums, orthonormalization
// and cuSOLVER workspaces).
struct DeviceAllocator {
  lowrankAllocFn_t alloc = nullptr;  // both null: CUDA's own allocation
  lowrankFreeFn_t free = nullptr;
  void* userdata = nullptr;
  void* stream = nullptr;  // what alloc is given (the memory's first use is in its order)
};
struct TableMemory {
  DeviceAllocator allocator;
  uint64_t tables = 0, workspace = 0;  // bytes
  bool refused = false;                // the allocator refused an allocation
};
struct BlockTable;
struct ExactTable;
struct OrthoTable;
cudaError_t createBlockTable(const BlockDesc* blocks, size_t n, BlockTable** out,
                             cudaStream_t stream = nullptr, TableMemory* mem = nullptr);
cudaError_t createExactTable(const ExactDesc* runs, size_t n, ExactTable** out,
                             cudaStream_t stream = nullptr, TableMemory* mem = nullptr);
cudaError_t createOrthoTable(const OrthoDesc* mats, size_t n, OrthoTable** out,
                             cudaStream_t stream = nullptr, TableMemory* mem = nullptr);
void destroy(BlockTable*);
void destroy(ExactTable*);
void destroy(OrthoTable*);

// Pass 1, fused error-feedback add and P = M Q, for every row block in the table:
//   M = G + E (E += G in place when e != nullptr, so e then holds M), P = M Q.
// qt: the whole tensors' Qt (BlockDesc::qt/qld index it). Adds to *nonFinite (device float) the
// number of elements of M that are NaN, Inf or >= limit in magnitude (saturating is fine above
// 2^20). Host twin: host::errorFeedbackAndP.
cudaError_t errorFeedbackAndP(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                              const float* qt, float* p, float* nonFinite, cudaStream_t stream);

// Pass 2, Q = M^T P for every column block: writes the block's Qt (k x cols at qt + desc.qt,
// row stride qld). M is e when e != nullptr, else g. Deterministic (no float atomics).
// Host twin: host::computeQ.
cudaError_t computeQ(const BlockTable* t, const void* g, lowrankDataType_t dtype, const float* e,
                     const float* p, float* qt, cudaStream_t stream);

// Pass 3, fused decompress and error update for every column block, with A = P Qbar^T:
//   out = scale * A (cast to dtype), and E = M - A when e != nullptr.
// out may alias g. checks: device pointer to the allreduced [non-finite count, op code]; when
// checks[0] != 0 or checks[1] != expectedOp the call must not be trusted: out = NaN and E = 0 for
// every element of the blocks (the engine reports it). checks == nullptr: no check.
// Host twin: host::decompressAndUpdateError.
cudaError_t decompressAndUpdateError(const BlockTable* t, float* e, const float* p,
                                     const float* qbart, float scale, void* out,
                                     lowrankDataType_t dtype, const float* checks,
                                     float expectedOp, cudaStream_t stream);

// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors"): one factor per call,
// computed against the kept other one, the residual of the comm rank's own factor taken before
// the allreduce (kernels/cuda/alternate.cu says how each step moves its bytes).
// P step, for every row block (qt: the whole tensors' kept Qt, orthonormal):
//   M = G + E (into E), P = M Q, E = M - P Q^T. Fused per row: one launch.
// Q step, for every column block (p: the tensors' kept P, orthonormal; qt: the block's Qt, k x
// cols at qt + desc.qt, row stride qld, written): M = G + E (into E), Q = M^T P, E = M - P Q^T.
// Two launches (Q's column needs every row of M first): pass 2 with M written back and counted,
// then E -= P Q^T by pass 3's tiles.
// e null: M = G, no residual kept. Both add to *nonFinite the count of elements of M that are NaN,
// Inf or not below the block's limit, as pass 1 (the Q step's blocks need their tensor's limit).
// wire (16-bit factors, lowrankBfloat16 or lowrankFloat16): the step's own factor is rounded to
// it before the residual is taken, as its allreduce will carry it, so that the residual keeps what
// the wire drops (with e only; lowrankFloat32: untouched).
// Host twins: host::alternateStepP, host::alternateStepQ (their `wire`).
cudaError_t alternateStepP(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                           const float* qt, float* p, float* nonFinite, cudaStream_t stream,
                           lowrankDataType_t wire = lowrankFloat32);
cudaError_t alternateStepQ(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                           const float* p, float* qt, float* nonFinite, cudaStream_t stream,
                           lowrankDataType_t wire = lowrankFloat32);
// The alternating decompression (row blocks after a P step, column blocks after a Q step):
// out = scale * P Qbar^T (cast to dtype); E is neither read nor written (its residual was taken
// before the allreduce), except on a call not to be trusted (checks, as pass 3): out = NaN and
// E = 0 where e != nullptr. Host twin: host::decompressAndUpdateError with e == nullptr.
cudaError_t decompressAlternate(const BlockTable* t, float* e, const float* p, const float* qbart,
                                float scale, void* out, lowrankDataType_t dtype,
                                const float* checks, float expectedOp, cudaStream_t stream);
// A rejected P step (checks[0] != 0 or checks[1] != expectedOp; checks on the device, required):
// every matrix of the table (the tensors' P, which the allreduce overwrote with what the call
// must not keep) set to the first k unit vectors, orthonormal and the same on every comm rank, so
// that the next call, a Q step, runs against a valid factor. Nothing is written otherwise. No
// host twin: the host engine resets the state of a rejected call instead (docs/design.md).
cudaError_t unitFactorIfRejected(const OrthoTable* t, float* base, const float* checks,
                                 float expectedOp, cudaStream_t stream);

// Orthonormalizes every matrix of the table in place (float64 inside): Gram-Schmidt twice with
// epsilon for k <= 2, Householder QR (thin Q) for k > 2, exactly as host::orthonormalize, so a zero
// or dependent column never gives NaN. Host twin: host::orthonormalize. Tall matrices (k <= 32,
// n k >= 4096) take a multi-block CholeskyQR2 whose columns are given the host's signs (and, for
// k <= 2, its epsilon); a matrix it finds (nearly) rank deficient or non-finite is redone, on the
// device, by the one-block algorithm. Tall matrices with k > 32 take cuSOLVER's Householder QR
// (geqrf + orgqr, loaded at table creation: kernels/cuda/dense_qr.h) with the host's column
// signs, where cuSOLVER loads; past the rank of a rank-deficient matrix its columns may differ
// from the host's (still orthonormal, never NaN). Errors: a cuSOLVER failure is cudaErrorUnknown.
cudaError_t orthonormalize(const OrthoTable* t, float* base, double eps, cudaStream_t stream);

// Exact part: payload = float32(G) over every run, adding the non-finite count to *nonFinite;
// and back: out = scale * payload, cast to dtype. Host twins: phases::packExact / unpackExact.
cudaError_t packExact(const ExactTable* t, const void* g, lowrankDataType_t dtype, float* payload,
                      float* nonFinite, cudaStream_t stream);
cudaError_t unpackExact(const ExactTable* t, const float* payload, float scale, void* out,
                        lowrankDataType_t dtype, cudaStream_t stream);

// 16-bit factors on the wire (wire lowrankBfloat16 or lowrankFloat16): n floats of x rounded to
// nearest even into out (n 16-bit words), and back (exact). Host twins: host::toBf16 / toHalf and
// toFloat (util/convert.h), as transport/wire.h encodes and decodes.
cudaError_t toWire(const float* x, size_t n, void* out, lowrankDataType_t wire, cudaStream_t stream);
cudaError_t fromWire(const void* in, size_t n, float* x, lowrankDataType_t wire,
                     cudaStream_t stream);

// x *= s over n floats. Host twin: host::scale.
cudaError_t scale(float* x, size_t n, float s, cudaStream_t stream);

// Warm start: copies each column block's Qbar from the wire layout (src = BlockDesc::qt/qld, the
// same table as pass 2/3) into the whole-tensor Qt (dst at tensorQt[b] with row stride tensorCols[b],
// given per block at creation: see createScatterTable), unless checks says the call is not trusted
// (then dst is left as it was, so a bad call never poisons the warm start).
struct ScatterTable;
cudaError_t createScatterTable(const BlockDesc* blocks, const uint64_t* dstOffset,
                               const uint64_t* dstLd, size_t n, ScatterTable** out,
                               cudaStream_t stream = nullptr, TableMemory* mem = nullptr);
void destroy(ScatterTable*);
cudaError_t scatterQ(const ScatterTable* t, const float* wire, float* qt, const float* checks,
                     float expectedOp, cudaStream_t stream);

// Sets *x = v (one float), on the stream.
cudaError_t setFloat(float* x, float v, cudaStream_t stream);

}  // namespace lowrank::cuda
