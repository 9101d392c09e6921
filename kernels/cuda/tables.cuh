// The device tables behind the opaque handles of powersgd_kernels.h, and the tile shapes they are
// planned for. A batched launch indexes its CUDA blocks (tiles) through a prefix array: tiles of
// block b are [prefix[b], prefix[b + 1]).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/powersgd_kernels.h"

namespace lowrank::cuda {
namespace detail {

constexpr int kThreads = 256;  // every batched pass kernel
constexpr uint32_t kMaxDim = 0x7fffffffu - 1024;  // rows and columns of a block, at most
constexpr int kWarps = kThreads / 32;
// Tiles are sized so a launch has at least this many CUDA blocks where the shapes allow
// (several waves on any current GPU). A constant, not the device's SM count: the partial sums,
// hence the rounding, must not depend on which GPU runs the plan.
constexpr uint64_t kTargetCtas = 2048;

// k bucket of the templated fast path: the next power of two >= k, at most 32 (k > 32 loops over
// groups of 32).
constexpr int kBucketMax = 32;
inline int kBucket(uint32_t k) {
  int b = 1;
  while (b < int(k) && b < kBucketMax) b *= 2;
  return b;
}

// Pass 1: a tile is kWarps * rowsPerWarp1(K) rows x ct1 columns; each warp keeps rowsPerWarp1 rows
// x K accumulators in registers, so each Qt element loaded serves several rows.
__host__ __device__ constexpr int rowsPerWarp1(int K) { return K >= 16 ? 2 : 4; }
// Register budget of pass 1 (CUDA blocks per SM asked of ptxas): enough warps in flight to cover
// memory latency without spilling the accumulators.
__host__ __device__ constexpr int minBlocks1(int) { return 2; }
// Column steps of 32 whose loads pass 1 issues together (RW x U loads of G and of E in flight).
__host__ __device__ constexpr int stepsPerLoad1(int K) { return K == 16 || K <= 2 ? 4 : 2; }
constexpr uint64_t kMinChunk1 = 512, kMaxChunk1 = uint64_t(1) << 20;
// Pass 2: a tile is kCols2 columns (2 per lane, a warp spans them) x sr2 rows, the rows dealt to
// the warps, P staged in shared memory chunkRows2(K) rows at a time.
constexpr int kCols2 = 64;
// Rows per chunk: each warp issues 2 chunkRows2 / kWarps loads of M at once (128 rows took twice
// the registers for the addresses, halving the CUDA blocks per SM: no more bytes in flight).
__host__ __device__ constexpr int chunkRows2(int) { return 64; }
// CUDA blocks per SM asked of ptxas (it otherwise spends registers on unrolling, not on bytes in
// flight).
__host__ __device__ constexpr int minBlocks2(int K) { return K >= 8 ? 2 : 3; }
constexpr uint64_t kMinSlab2 = 256, kMaxSlab2 = uint64_t(1) << 20;
// Pass 3: a tile is kCols3 columns (one per thread, Qbar in registers) x kRows3 rows (P in shared).
constexpr int kCols3 = kThreads;
constexpr int kRows3 = 64;
constexpr int kStep3 = 8;  // rows whose loads are issued together (divides kRows3)
static_assert(kRows3 % kStep3 == 0, "pass 3 steps cover the tile");
// Alternating P step (alternate.cu): a tile is kWarps * rowsPerWarpA(K) whole rows (each warp
// its rows' P finished in the warp, so that the residual's sweep follows at once). One row per
// warp from K = 16 on: two spilled 400 bytes at K = 32 (ptxas, sm_80 and sm_90).
__host__ __device__ constexpr int rowsPerWarpA(int K) { return K >= 16 ? 1 : 2; }
// Deterministic second reductions: one thread per output element.
constexpr int kReduceThreads = 256;
// Element-wise kernels (exact part, scatterQ): elements per CUDA block.
constexpr int kElemsPerCta = 4 * kThreads;

// Orthonormalize, multi-block path (CholeskyQR2 in float64, kernels/cuda/orthonormalize.cu): for
// matrices with k <= kMultiMaxK and n k >= kMultiMinElems. A Gram tile is kMultiTileRows rows,
// staged in shared memory multiChunk(K) rows at a time.
constexpr int kMultiThreads = 256;  // Gram and apply kernels
constexpr int kCholThreads = 512;   // the per-matrix Cholesky kernel
constexpr uint32_t kMultiMaxK = 32;
constexpr uint64_t kMultiMinElems = 4096;
constexpr int kMultiTileRows = 256;
__host__ __device__ constexpr int multiChunk(int K) { return K >= 32 ? 64 : K >= 16 ? 128 : 256; }
static_assert(kMultiTileRows % multiChunk(32) == 0 && kMultiTileRows % multiChunk(16) == 0 &&
                  kMultiTileRows % multiChunk(1) == 0,
              "chunks cover a tile");
inline bool multiBlockOrtho(const OrthoDesc& d) {
  return d.k >= 1 && d.k <= kMultiMaxK && d.n >= d.k && d.n * d.k >= kMultiMinElems;
}
constexpr uint64_t kNoFlag = ~uint64_t(0);

// Orthonormalize, dense-QR path: cuSOLVER's geqrf + orgqr (kernels/cuda/dense_qr.h), where the
// library loads, for the matrices too wide for the multi-block path and too large for one CUDA
// block to be quick: k > kMultiMaxK, n k >= kMultiMinElems (and n, k within cuSOLVER's int).
inline bool denseQrOrtho(const OrthoDesc& d) {  // cuSOLVER's int API: n k < 2^31
  return d.k > kMultiMaxK && d.n >= d.k && d.n * d.k >= kMultiMinElems && d.n * d.k <= 0x7fffffffu;
}
constexpr uint64_t kDenseSliceElems = 16384;  // elements per CUDA block of the dense copies
constexpr uint32_t kDenseMaxSlices = 256;
constexpr uint64_t kSkipMatrix = kNoFlag - 1;  // flagOff: never done by the one-block kernel

// A dense-QR matrix's places in the workspace (doubles): the column-major n x k copy (A, then Q),
// the top k x k block of Q for the signs, tau (then the column signs) and R's diagonal.
struct OrthoDense {
  OrthoDesc d;
  uint64_t a = 0, q1 = 0, tau = 0, rdiag = 0;
};

struct OrthoMulti {
  OrthoDesc d;
  uint64_t tiles = 0;    // Gram tiles: ceil(n / kMultiTileRows)
  uint64_t partial = 0;  // workspace (doubles): tiles x k x k partial Grams
  uint64_t rinv1 = 0;    // k x k: R1^-1 of the first pass
  uint64_t rinv = 0;     // k x k: the final (R2 R1)^-1 D, D the column signs
  uint64_t flag = 0;     // 1 double: nonzero = fall back to the one-block algorithm
};

struct DevBlock {
  BlockDesc d;
  uint64_t rowTiles1 = 0, chunks1 = 0;  // pass 1 tiles: rowTiles1 x chunks1
  uint64_t ws1 = 0;                     // pass 1 partial P (chunks1 x rows x k) when chunks1 > 1
  uint64_t colTiles2 = 0, slabs2 = 0;   // pass 2 tiles: colTiles2 x slabs2
  uint64_t ws2 = 0;                     // pass 2 partial Qt (slabs2 x k x cols) when slabs2 > 1
  uint64_t colTiles3 = 0;               // pass 3 tiles: rowTiles3 x colTiles3
};

// kTilesA: the alternating P step's tiles (whole rows, kWarps * rowsPerWarpA per tile).
enum Prefix { kTiles1, kReduce1, kTiles2, kReduce2, kTiles3, kTilesA, kPrefixes };

}  // namespace detail

struct BlockTable;
namespace detail {
// The alternating Q step's two launches (alternate.cu): pass 2 with M = G + E written into E
// (e null: M = G) and its elements beyond each block's limit counted into *nonFinite (pass2.cu);
// then E -= P Qt^T over the blocks (pass 3's tiles, no output; pass3.cu).
cudaError_t computeQCounting(const BlockTable* t, const void* g, lowrankDataType_t dtype, float* e,
                             const float* p, float* qt, float* nonFinite, cudaStream_t stream);
cudaError_t subtractLowRank(const BlockTable* t, float* e, const float* p, const float* qt,
                            cudaStream_t stream);
}  // namespace detail

struct BlockTable {
  cudaStream_t stream = nullptr;  // allocated on (null: synchronously)
  DeviceAllocator allocator;      // the memory's (none: CUDA's)
  uint32_t n = 0;
  uint32_t kmax = 0;
  int bucket = 1;             // kBucket(kmax)
  uint64_t ct1 = 0, sr2 = 0;  // pass 1 chunk width, pass 2 slab height
  uint64_t total[detail::kPrefixes] = {};
  detail::DevBlock* blocks = nullptr;  // device, n
  uint64_t* prefix = nullptr;          // device, kPrefixes arrays of n + 1
  float* ws = nullptr;                 // device workspace of pass 1 and pass 2 partial sums
  const uint64_t* pre(int which) const { return prefix + uint64_t(which) * (n + 1); }
};

struct ExactTable {
  cudaStream_t stream = nullptr;  // allocated on (null: synchronously)
  DeviceAllocator allocator;      // the memory's (none: CUDA's)
  uint32_t n = 0;
  uint64_t tiles = 0;
  ExactDesc* runs = nullptr;   // device, n
  uint64_t* prefix = nullptr;  // device, n + 1 (tiles of kElemsPerCta elements)
};

struct OrthoTable {
  cudaStream_t stream = nullptr;  // allocated on (null: synchronously)
  DeviceAllocator allocator;      // the memory's (none: CUDA's)
  uint32_t n = 0;
  OrthoDesc* mats = nullptr;  // device, n
  uint64_t* wsOff = nullptr;  // device, n: each matrix's float64 workspace, 2 n k + k doubles
  uint64_t* flagOff = nullptr;  // device, n: the multi-block path's flag in ws, or kNoFlag
  double* ws = nullptr;
  // Multi-block path (detail::multiBlockOrtho): its matrices, Gram tiles by prefix.
  uint32_t nMulti = 0;
  int bucket = 1;  // kBucket of their largest k
  uint64_t multiTiles = 0;
  detail::OrthoMulti* multi = nullptr;  // device, nMulti
  uint64_t* multiPrefix = nullptr;      // device, nMulti + 1
  // Dense-QR path (detail::denseQrOrtho, where cuSOLVER loads): its matrices, on the device for
  // the copy kernels and on the host for the per-matrix cuSOLVER calls; a cuSOLVER handle and
  // its workspace (lwork doubles) for this table alone.
  std::vector<detail::OrthoDense> denseHost;
  detail::OrthoDense* dense = nullptr;  // device, denseHost.size()
  uint32_t denseSlices = 1;             // CUDA blocks per matrix of the dense copies
  void* solver = nullptr;
  double* solverWork = nullptr;
  int solverLwork = 0;
  int* solverInfo = nullptr;  // device, 1
};

struct ScatterTable {
  cudaStream_t stream = nullptr;  // allocated on (null: synchronously)
  DeviceAllocator allocator;      // the memory's (none: CUDA's)
  struct Dev {
    BlockDesc d;
    uint64_t dstOffset = 0, dstLd = 0;
  };
  uint32_t n = 0;
  uint64_t tiles = 0;
  Dev* blocks = nullptr;       // device, n
  uint64_t* prefix = nullptr;  // device, n + 1 (tiles of kElemsPerCta elements of k x cols)
};

}  // namespace lowrank::cuda
