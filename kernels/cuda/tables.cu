// Plan-time creation of the device tables: tile counts, prefix arrays and workspaces, uploaded once
// (synchronous cudaMalloc / cudaMemcpy, or stream-ordered on the table's stream).
#include <algorithm>
#include <new>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dense_qr.h"
#include "kernels/cuda/tables.cuh"

namespace lowrank::cuda {
namespace {

using namespace detail;

// Device memory of a table: the supplied allocator's where mem has one, else synchronous without
// a stream or stream-ordered on it; counted in mem (workspace or tables) when given.
cudaError_t devAlloc(void** p, size_t bytes, cudaStream_t stream, TableMemory* mem, bool workspace) {
  *p = nullptr;
  if (mem && mem->allocator.alloc) {
    const DeviceAllocator& a = mem->allocator;
    if (a.alloc(p, bytes, a.stream, a.userdata) != lowrankSuccess || !*p) {
      *p = nullptr;
      mem->refused = true;
      return cudaErrorMemoryAllocation;
    }
  } else if (cudaError_t err = stream ? cudaMallocAsync(p, bytes, stream) : cudaMalloc(p, bytes)) {
    *p = nullptr;
    return err;
  }
  if (mem) (workspace ? mem->workspace : mem->tables) += bytes;
  return cudaSuccess;
}
template <typename T>
cudaError_t devAlloc(T** p, size_t count, cudaStream_t stream, TableMemory* mem,
                     bool workspace = false) {
  return devAlloc(reinterpret_cast<void**>(p), count * sizeof(T), stream, mem, workspace);
}
// Back to where it came from, in `stream`'s order (null: now).
void devFree(void* p, cudaStream_t stream, const DeviceAllocator& a) {
  if (!p) return;
  if (a.free) a.free(p, stream, a.userdata);
  else if (stream) cudaFreeAsync(p, stream);
  else cudaFree(p);
}

// Uploads `count` elements of `src` into a fresh device allocation (nothing for count 0). On a
// stream the pageable source is staged before cudaMemcpyAsync returns (it may go at once).
template <typename T>
cudaError_t upload(const T* src, size_t count, T** dst, cudaStream_t stream, TableMemory* mem) {
  *dst = nullptr;
  if (count == 0) return cudaSuccess;
  cudaError_t err = devAlloc(dst, count, stream, mem);
  if (err != cudaSuccess) return err;
  err = stream ? cudaMemcpyAsync(*dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream)
               : cudaMemcpy(*dst, src, count * sizeof(T), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    devFree(*dst, stream, mem ? mem->allocator : DeviceAllocator());
    *dst = nullptr;
  }
  return err;
}

// Pass 1 tiles of a block for chunk width ct: every row of P is written, so a block with rows but
// no columns still has one (zero-writing) chunk per row tile.
uint64_t rowTiles1(const BlockDesc& d, int bucket) {
  return d.k == 0 ? 0 : ceilDiv(d.rows, uint64_t(kWarps) * rowsPerWarp1(bucket));
}
uint64_t chunks1(const BlockDesc& d, uint64_t ct) {
  return std::max<uint64_t>(1, ceilDiv(d.cols, ct));
}
// Pass 2 likewise writes every column of Qt, rows or not.
uint64_t colTiles2(const BlockDesc& d) { return d.k == 0 ? 0 : ceilDiv(d.cols, kCols2); }
uint64_t slabs2(const BlockDesc& d, uint64_t sr) {
  return std::max<uint64_t>(1, ceilDiv(d.rows, sr));
}

}  // namespace

cudaError_t createBlockTable(const BlockDesc* blocks, size_t n, BlockTable** out,
                             cudaStream_t stream, TableMemory* mem) {
  if (!out || (n && !blocks) || n >= UINT32_MAX) return cudaErrorInvalidValue;
  *out = nullptr;
  auto* t = new (std::nothrow) BlockTable;
  if (!t) return cudaErrorMemoryAllocation;
  t->n = uint32_t(n);
  t->stream = stream;
  if (mem) t->allocator = mem->allocator;
  std::vector<DevBlock> dev(n);
  for (size_t b = 0; b < n; ++b) {
    if (blocks[b].rows > kMaxDim || blocks[b].cols > kMaxDim) {  // pass 1 indexes columns in int32
      delete t;
      return cudaErrorInvalidValue;
    }
    dev[b].d = blocks[b];
    if (dev[b].d.ld == 0) dev[b].d.ld = dev[b].d.cols;  // as host MatrixView::stride()
    if (dev[b].d.qld == 0) dev[b].d.qld = dev[b].d.cols;
    t->kmax = std::max(t->kmax, blocks[b].k);
  }
  t->bucket = kBucket(t->kmax);

  // Widest pass 1 chunks / tallest pass 2 slabs that still give kTargetCtas tiles: fewer partial
  // sums to write and reduce, enough CUDA blocks to fill the GPU.
  auto total1 = [&](uint64_t ct) {
    uint64_t s = 0;
    for (const DevBlock& x : dev) s += rowTiles1(x.d, t->bucket) * chunks1(x.d, ct);
    return s;
  };
  auto total2 = [&](uint64_t sr) {
    uint64_t s = 0;
    for (const DevBlock& x : dev) s += colTiles2(x.d) * slabs2(x.d, sr);
    return s;
  };
  t->ct1 = kMaxChunk1;
  while (t->ct1 > kMinChunk1 && total1(t->ct1) < kTargetCtas) t->ct1 /= 2;
  t->sr2 = kMaxSlab2;
  while (t->sr2 > kMinSlab2 && total2(t->sr2) < kTargetCtas) t->sr2 /= 2;

  std::vector<uint64_t> pre(size_t(kPrefixes) * (n + 1), 0);
  uint64_t ws1 = 0, ws2 = 0;
  for (size_t b = 0; b < n; ++b) {
    DevBlock& x = dev[b];
    const BlockDesc& d = x.d;
    x.rowTiles1 = rowTiles1(d, t->bucket);
    x.chunks1 = chunks1(d, t->ct1);
    x.colTiles2 = colTiles2(d);
    x.slabs2 = slabs2(d, t->sr2);
    x.colTiles3 = d.k == 0 ? 0 : ceilDiv(d.cols, kCols3);
    const uint64_t rowTiles3 = ceilDiv(d.rows, kRows3);
    uint64_t tiles[kPrefixes] = {};
    tiles[kTiles1] = x.rowTiles1 * x.chunks1;
    if (x.rowTiles1 && x.chunks1 > 1) {
      x.ws1 = ws1;
      ws1 += x.chunks1 * d.rows * d.k;
      tiles[kReduce1] = ceilDiv(uint64_t(d.rows) * d.k, kReduceThreads);
    }
    tiles[kTiles2] = x.colTiles2 * x.slabs2;
    if (x.colTiles2 && x.slabs2 > 1) {
      x.ws2 = ws2;
      ws2 += x.slabs2 * d.k * d.cols;
      tiles[kReduce2] = ceilDiv(uint64_t(d.cols) * d.k, kReduceThreads);
    }
    tiles[kTiles3] = rowTiles3 * x.colTiles3;
    tiles[kTilesA] = d.k == 0 ? 0 : ceilDiv(d.rows, uint64_t(kWarps) * rowsPerWarpA(t->bucket));
    for (int w = 0; w < kPrefixes; ++w) {
      uint64_t* p = pre.data() + size_t(w) * (n + 1);
      p[b + 1] = p[b] + tiles[w];
    }
  }
  for (int w = 0; w < kPrefixes; ++w) {
    t->total[w] = pre[size_t(w) * (n + 1) + n];
    if (t->total[w] > kMaxGrid) {
      delete t;
      return cudaErrorInvalidValue;
    }
  }

  cudaError_t err = upload(dev.data(), n, &t->blocks, t->stream, mem);
  if (err == cudaSuccess) err = upload(pre.data(), pre.size(), &t->prefix, t->stream, mem);
  const uint64_t wsFloats = std::max(ws1, ws2);  // pass 1 and 2 never run at once on a table
  if (err == cudaSuccess && wsFloats)
    err = devAlloc(&t->ws, wsFloats, t->stream, mem, true);
  if (err != cudaSuccess) {
    t->ws = nullptr;
    destroy(t);
    return err;
  }
  *out = t;
  return cudaSuccess;
}

void destroy(BlockTable* t) {
  if (!t) return;
  devFree(t->blocks, t->stream, t->allocator);
  devFree(t->prefix, t->stream, t->allocator);
  devFree(t->ws, t->stream, t->allocator);
  delete t;
}

cudaError_t createExactTable(const ExactDesc* runs, size_t n, ExactTable** out,
                             cudaStream_t stream, TableMemory* mem) {
  if (!out || (n && !runs) || n >= UINT32_MAX) return cudaErrorInvalidValue;
  *out = nullptr;
  auto* t = new (std::nothrow) ExactTable;
  if (!t) return cudaErrorMemoryAllocation;
  t->n = uint32_t(n);
  t->stream = stream;
  if (mem) t->allocator = mem->allocator;
  std::vector<uint64_t> pre(n + 1, 0);
  for (size_t i = 0; i < n; ++i) pre[i + 1] = pre[i] + ceilDiv(runs[i].numel, kElemsPerCta);
  t->tiles = pre[n];
  if (t->tiles > kMaxGrid) {
    delete t;
    return cudaErrorInvalidValue;
  }
  cudaError_t err = upload(runs, n, &t->runs, t->stream, mem);
  if (err == cudaSuccess) err = upload(pre.data(), pre.size(), &t->prefix, t->stream, mem);
  if (err != cudaSuccess) {
    destroy(t);
    return err;
  }
  *out = t;
  return cudaSuccess;
}

void destroy(ExactTable* t) {
  if (!t) return;
  devFree(t->runs, t->stream, t->allocator);
  devFree(t->prefix, t->stream, t->allocator);
  delete t;
}

// cuSOLVER's workspace for every dense-QR matrix of the table (the workspace ws exists).
static cudaError_t sizeSolverWork(OrthoTable* t, const DenseQrApi* api, TableMemory* mem) {
  int lwork = 1;
  for (const OrthoDense& x : t->denseHost) {
    const int n = int(x.d.n), k = int(x.d.k);
    int a = 0, b = 0;
    if (api->geqrfBufferSize(t->solver, n, k, t->ws + x.a, n, &a) != 0 ||
        api->orgqrBufferSize(t->solver, n, k, k, t->ws + x.a, n, t->ws + x.tau, &b) != 0)
      return cudaErrorUnknown;
    lwork = std::max({lwork, a, b});
  }
  t->solverLwork = lwork;
  cudaError_t err = devAlloc(&t->solverWork, size_t(lwork), t->stream, mem, true);
  if (err != cudaSuccess) {
    t->solverWork = nullptr;
    return err;
  }
  err = devAlloc(&t->solverInfo, 1, t->stream, mem, true);
  if (err != cudaSuccess) t->solverInfo = nullptr;
  return err;
}

cudaError_t createOrthoTable(const OrthoDesc* mats, size_t n, OrthoTable** out,
                             cudaStream_t stream, TableMemory* mem) {
  if (!out || (n && !mats) || n >= UINT32_MAX || n > kMaxGrid) return cudaErrorInvalidValue;
  *out = nullptr;
  auto* t = new (std::nothrow) OrthoTable;
  if (!t) return cudaErrorMemoryAllocation;
  t->n = uint32_t(n);
  t->stream = stream;
  if (mem) t->allocator = mem->allocator;
  // cuSOLVER is loaded, and a handle made, only for a table that has a matrix for it.
  const DenseQrApi* api = nullptr;
  if (std::any_of(mats, mats + n, denseQrOrtho) && (api = denseQrApi()) &&
      api->create(&t->solver) != 0) {
    t->solver = nullptr;
    api = nullptr;
  }
  std::vector<uint64_t> off(n), flagOff(n, kNoFlag);
  std::vector<OrthoMulti> multi;
  std::vector<uint64_t> pre(1, 0);
  uint64_t ws = 0;
  uint32_t kmax = 0;
  for (size_t i = 0; i < n; ++i) {
    off[i] = ws;
    ws += 2 * mats[i].n * mats[i].k + mats[i].k;  // the matrix, the reflectors, their flags
    if (api && denseQrOrtho(mats[i])) {
      OrthoDense x;
      x.d = mats[i];
      x.a = off[i];
      x.q1 = off[i] + x.d.n * x.d.k;  // k x k <= n x k: in the reflectors' place
      x.tau = off[i] + 2 * x.d.n * x.d.k;
      x.rdiag = ws;
      ws += x.d.k;
      t->denseHost.push_back(x);
      flagOff[i] = kSkipMatrix;
      t->denseSlices = uint32_t(std::max<uint64_t>(
          t->denseSlices, std::min<uint64_t>(kDenseMaxSlices,
                                             ceilDiv(x.d.n * x.d.k, kDenseSliceElems))));
    } else if (multiBlockOrtho(mats[i])) {
      OrthoMulti m;
      m.d = mats[i];
      const uint64_t kk = uint64_t(m.d.k) * m.d.k;
      m.tiles = ceilDiv(m.d.n, kMultiTileRows);
      m.partial = ws;
      ws += m.tiles * kk;
      m.rinv1 = ws;
      ws += kk;
      m.rinv = ws;
      ws += kk;
      m.flag = ws;
      ws += 1;
      flagOff[i] = m.flag;
      kmax = std::max(kmax, m.d.k);
      multi.push_back(m);
      pre.push_back(pre.back() + m.tiles);
    }
  }
  t->nMulti = uint32_t(multi.size());
  t->bucket = kBucket(std::max(kmax, 1u));
  t->multiTiles = pre.back();
  if (t->multiTiles > kMaxGrid) {
    destroy(t);
    return cudaErrorInvalidValue;
  }
  cudaError_t err = upload(mats, n, &t->mats, t->stream, mem);
  if (err == cudaSuccess) err = upload(off.data(), n, &t->wsOff, t->stream, mem);
  if (err == cudaSuccess) err = upload(flagOff.data(), n, &t->flagOff, t->stream, mem);
  if (err == cudaSuccess) err = upload(multi.data(), multi.size(), &t->multi, t->stream, mem);
  if (err == cudaSuccess && !multi.empty()) err = upload(pre.data(), pre.size(), &t->multiPrefix, t->stream, mem);
  if (err == cudaSuccess) err = upload(t->denseHost.data(), t->denseHost.size(), &t->dense, t->stream, mem);
  if (err == cudaSuccess && ws &&
      (err = devAlloc(&t->ws, ws, t->stream, mem, true)) != cudaSuccess)
    t->ws = nullptr;
  if (err == cudaSuccess && !t->denseHost.empty()) err = sizeSolverWork(t, api, mem);
  if (err != cudaSuccess) {
    destroy(t);
    return err;
  }
  *out = t;
  return cudaSuccess;
}

void destroy(OrthoTable* t) {
  if (!t) return;
  devFree(t->mats, t->stream, t->allocator);
  devFree(t->wsOff, t->stream, t->allocator);
  devFree(t->flagOff, t->stream, t->allocator);
  devFree(t->multi, t->stream, t->allocator);
  devFree(t->multiPrefix, t->stream, t->allocator);
  devFree(t->dense, t->stream, t->allocator);
  devFree(t->solverWork, t->stream, t->allocator);
  devFree(t->solverInfo, t->stream, t->allocator);
  if (t->solver) denseQrApi()->destroy(t->solver);
  devFree(t->ws, t->stream, t->allocator);
  delete t;
}

cudaError_t createScatterTable(const BlockDesc* blocks, const uint64_t* dstOffset,
                               const uint64_t* dstLd, size_t n, ScatterTable** out,
                               cudaStream_t stream, TableMemory* mem) {
  if (!out || (n && (!blocks || !dstOffset || !dstLd)) || n >= UINT32_MAX)
    return cudaErrorInvalidValue;
  *out = nullptr;
  auto* t = new (std::nothrow) ScatterTable;
  if (!t) return cudaErrorMemoryAllocation;
  t->n = uint32_t(n);
  t->stream = stream;
  if (mem) t->allocator = mem->allocator;
  std::vector<ScatterTable::Dev> dev(n);
  std::vector<uint64_t> pre(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    dev[i].d = blocks[i];
    if (dev[i].d.qld == 0) dev[i].d.qld = dev[i].d.cols;
    dev[i].dstOffset = dstOffset[i];
    dev[i].dstLd = dstLd[i];
    pre[i + 1] = pre[i] + ceilDiv(uint64_t(blocks[i].k) * blocks[i].cols, kElemsPerCta);
  }
  t->tiles = pre[n];
  if (t->tiles > kMaxGrid) {
    delete t;
    return cudaErrorInvalidValue;
  }
  cudaError_t err = upload(dev.data(), n, &t->blocks, t->stream, mem);
  if (err == cudaSuccess) err = upload(pre.data(), pre.size(), &t->prefix, t->stream, mem);
  if (err != cudaSuccess) {
    destroy(t);
    return err;
  }
  *out = t;
  return cudaSuccess;
}

void destroy(ScatterTable* t) {
  if (!t) return;
  devFree(t->blocks, t->stream, t->allocator);
  devFree(t->prefix, t->stream, t->allocator);
  delete t;
}

}  // namespace lowrank::cuda
