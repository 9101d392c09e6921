// Shared by the device kernel tests (tests/gpu/test_cuda_*.cc): skipping without a device, device
// memory, dtypes, and batched buffers of tensors of different shapes with their row and column
// blocks. The gaps between tensors and the parts of a padded or strided view that are not
// elements hold sentinels (NaN in the inputs): a kernel that reads them gets NaN, one that writes
// them is caught by comparing the whole buffer. Built against tests/gpu/emu, the same tests run
// the kernels on the CPU (gpu_kernels_emulated).
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/powersgd_kernels.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"

namespace lowrank::gputest {

namespace cu = lowrank::cuda;
namespace host = lowrank::host;

// ---------------------------------------------------------------------------------------------
// Device, memory, dtypes

inline std::string noDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
}

#define SKIP_WITHOUT_DEVICE()                \
  do {                                       \
    const std::string why_ = noDevice();     \
    if (!why_.empty()) GTEST_SKIP() << why_; \
  } while (0)

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// count elements of T in device memory, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(count, 1) * sizeof(T)) !=
        cudaSuccess)
      p_ = nullptr;
    EXPECT_NE(p_, nullptr) << "cudaMalloc of " << count * sizeof(T) << " bytes";
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { upload(h); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  void upload(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), count_);
    ASSERT_EQ(cudaMemcpy(p_, h.data(), count_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t count_;
};

constexpr lowrankDataType_t kDtypes[] = {lowrankFloat32, lowrankFloat16, lowrankBfloat16};

inline size_t dtypeSize(lowrankDataType_t t) { return t == lowrankFloat32 ? 4 : 2; }

inline const char* dtypeName(lowrankDataType_t t) {
  return t == lowrankFloat32 ? "f32" : t == lowrankFloat16 ? "f16" : "bf16";
}

// Relative rounding unit of the dtype (what one rounding to it may change).
inline double dtypeEps(lowrankDataType_t t) {
  return t == lowrankFloat32 ? 0x1p-23 : t == lowrankFloat16 ? 0x1p-10 : 0x1p-7;
}

inline std::vector<uint8_t> toBytes(const std::vector<float>& x, lowrankDataType_t t) {
  std::vector<uint8_t> b(x.size() * dtypeSize(t));
  host::fromFloat32(x.data(), x.size(), 1.f, b.data(), t);
  return b;
}

inline std::vector<float> toFloats(const std::vector<uint8_t>& b, lowrankDataType_t t) {
  std::vector<float> x(b.size() / dtypeSize(t));
  host::toFloat32(b.data(), t, x.size(), x.data());
  return x;
}

// Equal bits, or both NaN (the GPU's NaN is canonical, the CPU's keeps its payload).
inline bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

constexpr float kNaN = NAN;
constexpr float kUnwritten = 12345.f;  // initial content of outputs that must all be written

inline std::vector<float> normal(size_t count, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(count);
  for (float& v : x) v = scale * d(rng);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Buffers of several tensors, and their row / column blocks

// A tensor's matrix: rows x cols, row stride ld >= cols, its first `valid` elements exist.
struct Tensor {
  uint32_t rows, cols;
  uint64_t ld, valid;
};

// Tensors one after another in one buffer, kGap elements apart; their P (rows x k) and Qt
// (k x cols) one after another in the P and Qt arrays.
struct Buffer {
  static constexpr uint64_t kGap = 7;
  std::vector<Tensor> t;
  std::vector<uint32_t> k;
  std::vector<uint64_t> offset, pOff, qOff;
  uint64_t count = 0, pCount = 0, qCount = 0;
};

inline Buffer makeBuffer(const std::vector<Tensor>& ts, const std::vector<uint32_t>& ks) {
  Buffer b;
  b.t = ts;
  b.k = ks;
  b.count = Buffer::kGap;
  for (size_t i = 0; i < ts.size(); ++i) {
    b.offset.push_back(b.count);
    b.count += ts[i].valid + Buffer::kGap;
    b.pOff.push_back(b.pCount);
    b.pCount += uint64_t(ts[i].rows) * ks[i];
    b.qOff.push_back(b.qCount);
    b.qCount += uint64_t(ks[i]) * ts[i].cols;
  }
  return b;
}

inline std::vector<Tensor> standardTensors() {
  return {
      {37, 53, 53, 37 * 53},             // odd sizes
      {64, 1000, 1000, 64 * 1000},       // wide: pass 1 splits rows into column chunks
      {5, 3000, 3000, 5 * 3000 - 1234},  // padded: the last row partial
      {6, 700, 700, 3 * 700 + 100},      // padded: a partial row, then two missing rows
      {300, 17, 17, 300 * 17},           // tall and narrow: pass 2 cuts it into row slabs
      {20, 45, 64, 19 * 64 + 30},        // strided rows (ld > cols), the last row partial
  };
}

// k per tensor: a single k for every tensor, or mixed k in one table (kMixedSmall: the fast
// path's buckets; kMixedLarge: k > 32 with small k beside it).
constexpr int kMixedSmall = -1, kMixedLarge = -2;
inline std::vector<uint32_t> ksFor(int k, size_t n) {
  if (k == kMixedSmall) return std::vector<uint32_t>{3, 8, 1, 5, 2, 7};  // n == 6
  if (k == kMixedLarge) return std::vector<uint32_t>{40, 5, 33, 1, 2, 64};
  return std::vector<uint32_t>(n, uint32_t(k));
}
inline std::string kName(int k) {
  if (k == kMixedSmall) return "mixedSmall";
  if (k == kMixedLarge) return "mixedLarge";
  std::string s = "k";
  s += std::to_string(k);
  return s;
}

// Calls f(pos, i, j) for every element (i, j) of a block: pos = its buffer position.
template <typename F>
inline void forEachElement(const cu::BlockDesc& d, F&& f) {
  for (uint64_t i = 0; i < d.rows; ++i)
    for (uint64_t j = 0; j < d.cols; ++j)
      if (i * d.ld + j < d.valid) f(d.offset + i * d.ld + j, i, j);
}

// Positions that are elements of some tensor (everything else is gap or padding).
inline std::vector<char> elementMask(const Buffer& b) {
  std::vector<char> m(b.count, 0);
  for (size_t ti = 0; ti < b.t.size(); ++ti) {
    const Tensor& t = b.t[ti];
    for (uint64_t r = 0; r < t.valid; ++r)
      if (r % t.ld < t.cols && r / t.ld < t.rows) m[b.offset[ti] + r] = 1;
  }
  return m;
}

// values[i] at element positions i, the sentinel elsewhere.
inline std::vector<float> fillElements(const Buffer& b, const std::vector<float>& values,
                                       float sentinel) {
  const std::vector<char> m = elementMask(b);
  std::vector<float> x(b.count, sentinel);
  for (uint64_t i = 0; i < b.count; ++i)
    if (m[i]) x[i] = values[i];
  return x;
}

// Pass 1's row blocks: each tensor in two ([0, rows/2), [rows/2, rows)) where it has 2 rows.
inline cu::BlockDesc rowBlock(const Buffer& b, size_t ti, uint32_t r0, uint32_t r1, float limit) {
  const Tensor& t = b.t[ti];
  const uint64_t skip = uint64_t(r0) * t.ld;
  cu::BlockDesc d;
  d.offset = b.offset[ti] + skip;
  d.valid = t.valid > skip ? t.valid - skip : 0;
  d.ld = t.ld;
  d.rows = r1 - r0;
  d.cols = t.cols;
  d.k = b.k[ti];
  d.p = b.pOff[ti] + uint64_t(r0) * d.k;
  d.qt = b.qOff[ti];
  d.qld = t.cols;
  d.limit = limit;
  return d;
}

inline std::vector<cu::BlockDesc> rowBlocks(const Buffer& b, float limit) {
  std::vector<cu::BlockDesc> v;
  for (size_t ti = 0; ti < b.t.size(); ++ti) {
    const uint32_t rows = b.t[ti].rows, half = rows / 2;
    if (half > 0) v.push_back(rowBlock(b, ti, 0, half, limit));
    v.push_back(rowBlock(b, ti, half, rows, limit));
  }
  return v;
}

// Pass 2 / 3's column blocks: each tensor in two ([0, cols/3), [cols/3, cols)) where it has 3
// columns. Device Qt ("wire"): block after block, every other block with a row stride of cols + 3
// (padding the kernels must neither read nor write); host Qt: block after block, contiguous.
struct ColBlocks {
  std::vector<cu::BlockDesc> d;
  std::vector<size_t> tensor;
  std::vector<uint32_t> c0;
  std::vector<uint64_t> hostQ;  // each block's Qt in the host layout
  uint64_t wireCount = 0, hostCount = 0;
};

inline ColBlocks colBlocks(const Buffer& b) {
  ColBlocks cb;
  for (size_t ti = 0; ti < b.t.size(); ++ti) {
    const Tensor& t = b.t[ti];
    std::vector<uint32_t> cuts = {0};
    if (t.cols >= 3) cuts.push_back(t.cols / 3);
    cuts.push_back(t.cols);
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      const uint32_t c0 = cuts[s], c1 = cuts[s + 1];
      cu::BlockDesc d;
      d.offset = b.offset[ti] + c0;
      d.valid = t.valid > c0 ? t.valid - c0 : 0;
      d.ld = t.ld;
      d.rows = t.rows;
      d.cols = c1 - c0;
      d.k = b.k[ti];
      d.p = b.pOff[ti];
      d.qld = d.cols + (cb.d.size() % 2 ? 3 : 0);
      d.qt = cb.wireCount;
      cb.wireCount += uint64_t(d.k) * d.qld;
      cb.hostQ.push_back(cb.hostCount);
      cb.hostCount += uint64_t(d.k) * d.cols;
      cb.d.push_back(d);
      cb.tensor.push_back(ti);
      cb.c0.push_back(c0);
    }
  }
  return cb;
}

inline host::MatrixView viewOf(const cu::BlockDesc& d) {
  return host::MatrixView{d.rows, d.cols, d.valid, d.ld};
}

// Owns a device BlockTable.
struct BlockTableHolder {
  cu::BlockTable* t = nullptr;
  ~BlockTableHolder() { cu::destroy(t); }
};

// ---------------------------------------------------------------------------------------------
// Running and comparing the passes

struct PassCase {
  lowrankDataType_t dtype;
  int k;
  bool feedback;
};

inline std::string passCaseName(const ::testing::TestParamInfo<PassCase>& i) {
  return std::string(dtypeName(i.param.dtype)) + "_" + kName(i.param.k) +
         (i.param.feedback ? "_ef" : "_noef");
}

inline std::vector<PassCase> passCases() {
  std::vector<PassCase> v;
  for (lowrankDataType_t dt : kDtypes)
    for (int k : {1, 2, 3, 4, 8, 32, 40, kMixedSmall, kMixedLarge})
      for (bool ef : {true, false}) v.push_back({dt, k, ef});
  return v;
}

// Everything one pass-1 run produces.
struct Pass1Result {
  std::vector<float> e, p;
  float bad = 0;
};

// Runs pass 1 on the device and its host twin over the same inputs.
inline void runPass1(const Buffer& b, const std::vector<cu::BlockDesc>& blocks,
                     lowrankDataType_t dt, bool ef, const std::vector<uint8_t>& g,
                     const std::vector<float>& e0, const std::vector<float>& qt, Pass1Result* dev,
                     Pass1Result* hst) {
  const size_t es = dtypeSize(dt);
  hst->e = e0;
  hst->p.assign(b.pCount, kUnwritten);
  size_t bad = 0;
  for (const cu::BlockDesc& d : blocks)
    bad += host::errorFeedbackAndP(g.data() + d.offset * es, dt,
                                   ef ? hst->e.data() + d.offset : nullptr, viewOf(d),
                                   qt.data() + d.qt, int(d.k), hst->p.data() + d.p, d.limit);
  hst->bad = float(bad);

  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> de(e0), dq(qt), dp(std::vector<float>(b.pCount, kUnwritten)),
      dbad(std::vector<float>{0.f});
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(blocks.data(), blocks.size(), &tbl.t));
  CUDA_OK(cu::errorFeedbackAndP(tbl.t, dg.get(), dt, ef ? de.get() : nullptr, dq.get(), dp.get(),
                                dbad.get(), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  dev->e = de.download();
  dev->p = dp.download();
  dev->bad = dbad.download()[0];
}

// |P_dev - P_host| <= tol |M_i| |Q_c| for every element of P of every block (both non-finite
// where M's row i holds a non-finite value).
inline void expectPClose(const std::vector<cu::BlockDesc>& blocks, const std::vector<float>& m,
                         const std::vector<float>& qt, const Pass1Result& dev,
                         const Pass1Result& hst, double tol) {
  int reported = 0;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const cu::BlockDesc& d = blocks[bi];
    std::vector<double> rowNorm(d.rows, 0.0);
    std::vector<char> rowBad(d.rows, 0);
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t) {
      if (!std::isfinite(m[pos]))
        rowBad[i] = 1;
      else
        rowNorm[i] += double(m[pos]) * m[pos];
    });
    for (uint32_t c = 0; c < d.k; ++c) {
      double qn = 0;
      for (uint32_t j = 0; j < d.cols; ++j)
        qn += double(qt[d.qt + c * d.qld + j]) * qt[d.qt + c * d.qld + j];
      for (uint32_t i = 0; i < d.rows; ++i) {
        const size_t at = d.p + size_t(i) * d.k + c;
        const float pd = dev.p[at], ph = hst.p[at];
        bool ok;
        if (rowBad[i])
          ok = !std::isfinite(pd) && !std::isfinite(ph);
        else
          ok = std::fabs(double(pd) - ph) <= tol * std::sqrt(rowNorm[i] * qn) + 1e-30;
        if (!ok && reported++ < 10)
          ADD_FAILURE() << "P of block " << bi << " (" << d.rows << "x" << d.cols << ", k " << d.k
                        << ") row " << i << " col " << c << ": device " << pd << ", host " << ph;
      }
    }
  }
}

inline void expectSameFloats(const std::vector<float>& dev, const std::vector<float>& hst,
                             const char* what) {
  ASSERT_EQ(dev.size(), hst.size());
  int reported = 0;
  for (size_t i = 0; i < dev.size(); ++i)
    if (!sameFloat(dev[i], hst[i]) && reported++ < 10)
      ADD_FAILURE() << what << "[" << i << "]: device " << dev[i] << ", host " << hst[i];
}

// Device wire Qt -> host layout (k x cols per block, contiguous); the wire's padding must still
// hold `pad`.
inline std::vector<float> wireToHost(const ColBlocks& cb, const std::vector<float>& wire,
                                     float pad) {
  std::vector<float> h(cb.hostCount, kUnwritten);
  int reported = 0;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    for (uint32_t c = 0; c < d.k; ++c) {
      for (uint32_t j = 0; j < d.cols; ++j)
        h[cb.hostQ[bi] + size_t(c) * d.cols + j] = wire[d.qt + c * d.qld + j];
      for (uint64_t j = d.cols; j < d.qld; ++j)
        if (!sameFloat(wire[d.qt + c * d.qld + j], pad) && reported++ < 10)
          ADD_FAILURE() << "padding of the wire Qt of block " << bi << " was written";
    }
  }
  return h;
}

inline std::vector<float> hostToWire(const ColBlocks& cb, const std::vector<float>& h, float pad) {
  std::vector<float> wire(cb.wireCount, pad);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    for (uint32_t c = 0; c < d.k; ++c)
      for (uint32_t j = 0; j < d.cols; ++j)
        wire[d.qt + c * d.qld + j] = h[cb.hostQ[bi] + size_t(c) * d.cols + j];
  }
  return wire;
}

// |Q_dev - Q_host| <= tol |M_:j| |P_:c| for every element of every block's Qt.
inline void expectQClose(const ColBlocks& cb, const std::vector<float>& m,
                         const std::vector<float>& p, const std::vector<float>& qd,
                         const std::vector<float>& qh, double tol) {
  int reported = 0;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    std::vector<double> colNorm(d.cols, 0.0);
    forEachElement(
        d, [&](uint64_t pos, uint64_t, uint64_t j) { colNorm[j] += double(m[pos]) * m[pos]; });
    for (uint32_t c = 0; c < d.k; ++c) {
      double pn = 0;
      for (uint32_t i = 0; i < d.rows; ++i)
        pn += double(p[d.p + size_t(i) * d.k + c]) * p[d.p + size_t(i) * d.k + c];
      for (uint32_t j = 0; j < d.cols; ++j) {
        const size_t at = cb.hostQ[bi] + size_t(c) * d.cols + j;
        if (!(std::fabs(double(qd[at]) - qh[at]) <= tol * std::sqrt(colNorm[j] * pn) + 1e-30) &&
            reported++ < 10)
          ADD_FAILURE() << "Qt of block " << bi << " (tensor " << cb.tensor[bi] << ", " << d.rows
                        << "x" << d.cols << ", k " << d.k << ") row " << c << " col " << j
                        << ": device " << qd[at] << ", host " << qh[at];
      }
    }
  }
}

}  // namespace lowrank::gputest
