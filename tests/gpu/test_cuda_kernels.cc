// Every device kernel of kernels/cuda against its host twin (kernels/host, plugin/engine/phases):
// batched tables of tensors of different shapes (odd sizes, padded views, strided rows, several
// row / column blocks per tensor), k in {1, 2, 3, 4, 8, 32, 40} and mixed k in one table, the
// three dtypes, error feedback on and off. The gaps between tensors and the parts of a padded or
// strided view that are not elements hold sentinels (NaN in the inputs): a kernel that reads them
// gets NaN, one that writes them is caught by comparing the whole buffer.
// Without a CUDA device every test skips. Built against tests/gpu/emu, the same file runs the
// kernels on the CPU (gpu_kernels_emulated).
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

namespace cu = lowrank::cuda;
namespace host = lowrank::host;

namespace {

// ---------------------------------------------------------------------------------------------
// Device, memory, dtypes

std::string noDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
}

#define SKIP_WITHOUT_DEVICE()                        \
  do {                                               \
    const std::string why_ = noDevice();             \
    if (!why_.empty()) GTEST_SKIP() << why_;         \
  } while (0)

#define CUDA_OK(call)                                                               \
  do {                                                                              \
    const cudaError_t err_ = (call);                                                \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_);      \
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

size_t dtypeSize(lowrankDataType_t t) { return t == lowrankFloat32 ? 4 : 2; }

const char* dtypeName(lowrankDataType_t t) {
  return t == lowrankFloat32 ? "f32" : t == lowrankFloat16 ? "f16" : "bf16";
}

// Relative rounding unit of the dtype (what one rounding to it may change).
double dtypeEps(lowrankDataType_t t) {
  return t == lowrankFloat32 ? 0x1p-23 : t == lowrankFloat16 ? 0x1p-10 : 0x1p-7;
}

std::vector<uint8_t> toBytes(const std::vector<float>& x, lowrankDataType_t t) {
  std::vector<uint8_t> b(x.size() * dtypeSize(t));
  host::fromFloat32(x.data(), x.size(), 1.f, b.data(), t);
  return b;
}

std::vector<float> toFloats(const std::vector<uint8_t>& b, lowrankDataType_t t) {
  std::vector<float> x(b.size() / dtypeSize(t));
  host::toFloat32(b.data(), t, x.size(), x.data());
  return x;
}

// Equal bits, or both NaN (the GPU's NaN is canonical, the CPU's keeps its payload).
bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

constexpr float kNaN = NAN;
constexpr float kUnwritten = 12345.f;  // initial content of outputs that must all be written

std::vector<float> normal(size_t count, unsigned seed, float scale = 1.f) {
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

Buffer makeBuffer(const std::vector<Tensor>& ts, const std::vector<uint32_t>& ks) {
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

std::vector<Tensor> standardTensors() {
  return {
      {37, 53, 53, 37 * 53},               // odd sizes
      {64, 1000, 1000, 64 * 1000},         // wide: pass 1 splits rows into column chunks
      {5, 3000, 3000, 5 * 3000 - 1234},    // padded: the last row partial
      {6, 700, 700, 3 * 700 + 100},        // padded: a partial row, then two missing rows
      {300, 17, 17, 300 * 17},             // tall and narrow: pass 2 cuts it into row slabs
      {20, 45, 64, 19 * 64 + 30},          // strided rows (ld > cols), the last row partial
  };
}

// k per tensor: a single k for every tensor, or mixed k in one table (kMixedSmall: the fast
// path's buckets; kMixedLarge: k > 32 with small k beside it).
constexpr int kMixedSmall = -1, kMixedLarge = -2;
std::vector<uint32_t> ksFor(int k, size_t n) {
  if (k == kMixedSmall) return std::vector<uint32_t>{3, 8, 1, 5, 2, 7}; // n == 6
  if (k == kMixedLarge) return std::vector<uint32_t>{40, 5, 33, 1, 2, 64};
  return std::vector<uint32_t>(n, uint32_t(k));
}
std::string kName(int k) {
  if (k == kMixedSmall) return "mixedSmall";
  if (k == kMixedLarge) return "mixedLarge";
  std::string s = "k";
  s += std::to_string(k);
  return s;
}

// Calls f(pos, i, j) for every element (i, j) of a block: pos = its buffer position.
template <typename F>
void forEachElement(const cu::BlockDesc& d, F&& f) {
  for (uint64_t i = 0; i < d.rows; ++i)
    for (uint64_t j = 0; j < d.cols; ++j)
      if (i * d.ld + j < d.valid) f(d.offset + i * d.ld + j, i, j);
}

// Positions that are elements of some tensor (everything else is gap or padding).
std::vector<char> elementMask(const Buffer& b) {
  std::vector<char> m(b.count, 0);
  for (size_t ti = 0; ti < b.t.size(); ++ti) {
    const Tensor& t = b.t[ti];
    for (uint64_t r = 0; r < t.valid; ++r)
      if (r % t.ld < t.cols && r / t.ld < t.rows) m[b.offset[ti] + r] = 1;
  }
  return m;
}

// values[i] at element positions i, the sentinel elsewhere.
std::vector<float> fillElements(const Buffer& b, const std::vector<float>& values, float sentinel) {
  const std::vector<char> m = elementMask(b);
  std::vector<float> x(b.count, sentinel);
  for (uint64_t i = 0; i < b.count; ++i)
    if (m[i]) x[i] = values[i];
  return x;
}

// Pass 1's row blocks: each tensor in two ([0, rows/2), [rows/2, rows)) where it has 2 rows.
cu::BlockDesc rowBlock(const Buffer& b, size_t ti, uint32_t r0, uint32_t r1, float limit) {
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

std::vector<cu::BlockDesc> rowBlocks(const Buffer& b, float limit) {
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

ColBlocks colBlocks(const Buffer& b) {
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

host::MatrixView viewOf(const cu::BlockDesc& d) { return host::MatrixView{d.rows, d.cols, d.valid, d.ld}; }

// Owns a device BlockTable.
struct BlockTableHolder {
  cu::BlockTable* t = nullptr;
  ~BlockTableHolder() { cu::destroy(t); }
};

// ---------------------------------------------------------------------------------------------
// Pass 1: errorFeedbackAndP vs host::errorFeedbackAndP

struct PassCase {
  lowrankDataType_t dtype;
  int k;
  bool feedback;
};

std::string passCaseName(const ::testing::TestParamInfo<PassCase>& i) {
  return std::string(dtypeName(i.param.dtype)) + "_" + kName(i.param.k) +
         (i.param.feedback ? "_ef" : "_noef");
}

std::vector<PassCase> passCases() {
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
void runPass1(const Buffer& b, const std::vector<cu::BlockDesc>& blocks, lowrankDataType_t dt,
              bool ef, const std::vector<uint8_t>& g, const std::vector<float>& e0,
              const std::vector<float>& qt, Pass1Result* dev, Pass1Result* hst) {
  const size_t es = dtypeSize(dt);
  hst->e = e0;
  hst->p.assign(b.pCount, kUnwritten);
  size_t bad = 0;
  for (const cu::BlockDesc& d : blocks)
    bad += host::errorFeedbackAndP(g.data() + d.offset * es, dt, ef ? hst->e.data() + d.offset : nullptr,
                                   viewOf(d), qt.data() + d.qt, int(d.k), hst->p.data() + d.p,
                                   d.limit);
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
void expectPClose(const std::vector<cu::BlockDesc>& blocks, const std::vector<float>& m,
                  const std::vector<float>& qt, const Pass1Result& dev, const Pass1Result& hst,
                  double tol) {
  int reported = 0;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const cu::BlockDesc& d = blocks[bi];
    std::vector<double> rowNorm(d.rows, 0.0);
    std::vector<char> rowBad(d.rows, 0);
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t) {
      if (!std::isfinite(m[pos])) rowBad[i] = 1;
      else rowNorm[i] += double(m[pos]) * m[pos];
    });
    for (uint32_t c = 0; c < d.k; ++c) {
      double qn = 0;
      for (uint32_t j = 0; j < d.cols; ++j) qn += double(qt[d.qt + c * d.qld + j]) * qt[d.qt + c * d.qld + j];
      for (uint32_t i = 0; i < d.rows; ++i) {
        const size_t at = d.p + size_t(i) * d.k + c;
        const float pd = dev.p[at], ph = hst.p[at];
        bool ok;
        if (rowBad[i]) ok = !std::isfinite(pd) && !std::isfinite(ph);
        else ok = std::fabs(double(pd) - ph) <= tol * std::sqrt(rowNorm[i] * qn) + 1e-30;
        if (!ok && reported++ < 10)
          ADD_FAILURE() << "P of block " << bi << " (" << d.rows << "x" << d.cols << ", k " << d.k
                        << ") row " << i << " col " << c << ": device " << pd << ", host " << ph;
      }
    }
  }
}

void expectSameFloats(const std::vector<float>& dev, const std::vector<float>& hst,
                      const char* what) {
  ASSERT_EQ(dev.size(), hst.size());
  int reported = 0;
  for (size_t i = 0; i < dev.size(); ++i)
    if (!sameFloat(dev[i], hst[i]) && reported++ < 10)
      ADD_FAILURE() << what << "[" << i << "]: device " << dev[i] << ", host " << hst[i];
}

class Pass1 : public ::testing::TestWithParam<PassCase> {};

TEST_P(Pass1, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 1), kNaN), c.dtype);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 2, 0.1f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 3);
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
  Pass1Result dev, hst;
  runPass1(b, blocks, c.dtype, c.feedback, g, e0, qt, &dev, &hst);
  if (HasFatalFailure()) return;

  EXPECT_EQ(dev.bad, 0.f);
  EXPECT_EQ(hst.bad, 0.f);
  expectSameFloats(dev.e, hst.e, "E");  // E = float(G) + E: the same float addition
  const std::vector<float> m = c.feedback ? hst.e : toFloats(g, c.dtype);
  expectPClose(blocks, m, qt, dev, hst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Pass1, ::testing::ValuesIn(passCases()), passCaseName);

struct NonFiniteCase {
  lowrankDataType_t dtype;
  bool feedback;
};
class Pass1NonFinite : public ::testing::TestWithParam<NonFiniteCase> {};

// NaN, +-Inf and values at or above `limit` are counted (below it they are not); rows without
// them still give the host's P.
TEST_P(Pass1NonFinite, CountedAsTheHostCounts) {
  SKIP_WITHOUT_DEVICE();
  const NonFiniteCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(4, 6));
  std::vector<float> gv = fillElements(b, normal(b.count, 4), kNaN);
  // At most one special value per row of every tensor, so that its P row is non-finite on both.
  const float specials[] = {kNaN, INFINITY, -INFINITY, 150.f, -200.f, 99.f, 100.f};
  size_t s = 0;
  for (size_t ti = 0; ti < b.t.size(); ++ti) {
    const Tensor& t = b.t[ti];
    for (uint32_t i = 1; i < t.rows; i += 2) {
      const uint64_t rel = uint64_t(i) * t.ld + (i * 7) % t.cols;
      if (rel < t.valid) gv[b.offset[ti] + rel] = specials[s++ % 7];
    }
  }
  const std::vector<uint8_t> g = toBytes(gv, c.dtype);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 5, 0.1f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 6);
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, 100.f);
  Pass1Result dev, hst;
  runPass1(b, blocks, c.dtype, c.feedback, g, e0, qt, &dev, &hst);
  if (HasFatalFailure()) return;

  EXPECT_GT(hst.bad, 10.f);
  EXPECT_EQ(dev.bad, hst.bad);
  expectSameFloats(dev.e, hst.e, "E");
  // Rows with a NaN or Inf: P non-finite on both; rows with a big but finite value: as any row.
  expectPClose(blocks, c.feedback ? hst.e : toFloats(g, c.dtype), qt, dev, hst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, Pass1NonFinite,
    ::testing::Values(NonFiniteCase{lowrankFloat32, true}, NonFiniteCase{lowrankFloat32, false},
                      NonFiniteCase{lowrankFloat16, true}, NonFiniteCase{lowrankFloat16, false},
                      NonFiniteCase{lowrankBfloat16, true}, NonFiniteCase{lowrankBfloat16, false}),
    [](const ::testing::TestParamInfo<NonFiniteCase>& i) {
      return std::string(dtypeName(i.param.dtype)) + (i.param.feedback ? "_ef" : "_noef");
    });

// ---------------------------------------------------------------------------------------------
// Pass 2: computeQ vs host::computeQ

// Device wire Qt -> host layout (k x cols per block, contiguous); the wire's padding must still
// hold `pad`.
std::vector<float> wireToHost(const ColBlocks& cb, const std::vector<float>& wire, float pad) {
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

std::vector<float> hostToWire(const ColBlocks& cb, const std::vector<float>& h, float pad) {
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
void expectQClose(const ColBlocks& cb, const std::vector<float>& m,
                  const std::vector<float>& p, const std::vector<float>& qd,
                  const std::vector<float>& qh, double tol) {
  int reported = 0;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    std::vector<double> colNorm(d.cols, 0.0);
    forEachElement(d, [&](uint64_t pos, uint64_t, uint64_t j) { colNorm[j] += double(m[pos]) * m[pos]; });
    for (uint32_t c = 0; c < d.k; ++c) {
      double pn = 0;
      for (uint32_t i = 0; i < d.rows; ++i) pn += double(p[d.p + size_t(i) * d.k + c]) * p[d.p + size_t(i) * d.k + c];
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

class Pass2 : public ::testing::TestWithParam<PassCase> {};

TEST_P(Pass2, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const size_t es = dtypeSize(c.dtype);
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 7), kNaN), c.dtype);
  const std::vector<float> e = fillElements(b, normal(b.count, 8, 0.5f), kNaN);
  const std::vector<float> p = normal(b.pCount, 9);
  const ColBlocks cb = colBlocks(b);

  std::vector<float> qh(cb.hostCount, kUnwritten);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    host::computeQ(g.data() + d.offset * es, c.dtype, c.feedback ? e.data() + d.offset : nullptr,
                   viewOf(d), p.data() + d.p, int(d.k), qh.data() + cb.hostQ[bi]);
  }

  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> de(e), dp(p), dwire(std::vector<float>(cb.wireCount, kUnwritten));
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
  CUDA_OK(cu::computeQ(tbl.t, dg.get(), c.dtype, c.feedback ? de.get() : nullptr, dp.get(),
                       dwire.get(), nullptr));
  const std::vector<float> qd = wireToHost(cb, dwire.download(), kUnwritten);
  const std::vector<float> m = c.feedback ? e : toFloats(g, c.dtype);
  expectQClose(cb, m, p, qd, qh, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Pass2, ::testing::ValuesIn(passCases()), passCaseName);

// A block without rows still writes its Qt (zeros, as the host's memset); one without columns
// writes nothing and P is left alone.
TEST(Pass2Edges, EmptyBlocks) {
  SKIP_WITHOUT_DEVICE();
  cu::BlockDesc noRows;
  noRows.offset = 0, noRows.valid = 0, noRows.ld = 5, noRows.rows = 0, noRows.cols = 5;
  noRows.k = 3, noRows.p = 0, noRows.qt = 0, noRows.qld = 5;
  cu::BlockDesc noCols = noRows;
  noCols.rows = 4, noCols.cols = 0, noCols.qt = 15, noCols.qld = 0;
  const cu::BlockDesc blocks[] = {noRows, noCols};
  DeviceArray<float> dm(std::vector<float>(8, kNaN)), dp(std::vector<float>(12, 1.f)),
      dq(std::vector<float>(16, kUnwritten));
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(blocks, 2, &tbl.t));
  CUDA_OK(cu::computeQ(tbl.t, dm.get(), lowrankFloat32, nullptr, dp.get(), dq.get(), nullptr));
  const std::vector<float> q = dq.download();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(q[i], 0.f) << i;
  EXPECT_EQ(q[15], kUnwritten);
}

// ---------------------------------------------------------------------------------------------
// Pass 3: decompressAndUpdateError vs host::decompressAndUpdateError, and the checks

struct Pass3Inputs {
  Buffer b;
  ColBlocks cb;
  std::vector<float> e0, p, qh;  // qh: Qbar in the host layout
  std::vector<uint8_t> out0;     // the output buffer before the call (sentinels)
};

Pass3Inputs pass3Inputs(int k, lowrankDataType_t dt) {
  Pass3Inputs in;
  in.b = makeBuffer(standardTensors(), ksFor(k, 6));
  in.cb = colBlocks(in.b);
  in.e0 = fillElements(in.b, normal(in.b.count, 10), kNaN);
  in.p = normal(in.b.pCount, 11, 0.3f);
  in.qh = normal(in.cb.hostCount, 12, 0.3f);
  in.out0 = toBytes(std::vector<float>(in.b.count, 777.f), dt);
  return in;
}

struct Pass3Result {
  std::vector<float> e, out;
};

Pass3Result runDevicePass3(const Pass3Inputs& in, lowrankDataType_t dt, bool ef, float scale,
                           const float* hostChecks, float expectedOp) {
  Pass3Result r;
  const std::vector<float> checks =
      hostChecks ? std::vector<float>{hostChecks[0], hostChecks[1]} : std::vector<float>{0.f, 0.f};
  DeviceArray<float> de(in.e0), dp(in.p), dq(hostToWire(in.cb, in.qh, kNaN)), dchecks(checks);
  DeviceArray<uint8_t> dout(in.out0);
  BlockTableHolder tbl;
  EXPECT_EQ(cu::createBlockTable(in.cb.d.data(), in.cb.d.size(), &tbl.t), cudaSuccess);
  EXPECT_EQ(cu::decompressAndUpdateError(tbl.t, ef ? de.get() : nullptr, dp.get(), dq.get(), scale,
                                         dout.get(), dt, hostChecks ? dchecks.get() : nullptr,
                                         expectedOp, nullptr),
            cudaSuccess);
  r.e = de.download();
  r.out = toFloats(dout.download(), dt);
  return r;
}

Pass3Result runHostPass3(const Pass3Inputs& in, lowrankDataType_t dt, bool ef, float scale) {
  const size_t es = dtypeSize(dt);
  Pass3Result r;
  r.e = in.e0;
  std::vector<uint8_t> out = in.out0;
  for (size_t bi = 0; bi < in.cb.d.size(); ++bi) {
    const cu::BlockDesc& d = in.cb.d[bi];
    host::decompressAndUpdateError(ef ? r.e.data() + d.offset : nullptr, viewOf(d), in.p.data() + d.p,
                                   in.qh.data() + in.cb.hostQ[bi], int(d.k), scale,
                                   out.data() + d.offset * es, dt);
  }
  r.out = toFloats(out, dt);
  return r;
}

// Elements: within tolerance of the host (bound |P_i| |Qbar_j| on A); everything else untouched.
void expectPass3Close(const Pass3Inputs& in, lowrankDataType_t dt, float scale,
                      const Pass3Result& dev, const Pass3Result& hst) {
  const std::vector<char> mask = elementMask(in.b);
  std::vector<double> bound(in.b.count, 0.0);
  for (size_t bi = 0; bi < in.cb.d.size(); ++bi) {
    const cu::BlockDesc& d = in.cb.d[bi];
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t j) {
      double pn = 0, qn = 0;
      for (uint32_t c = 0; c < d.k; ++c) {
        pn += double(in.p[d.p + i * d.k + c]) * in.p[d.p + i * d.k + c];
        const double q = in.qh[in.cb.hostQ[bi] + c * d.cols + j];
        qn += q * q;
      }
      bound[pos] = std::sqrt(pn * qn);
    });
  }
  int reported = 0;
  for (uint64_t pos = 0; pos < in.b.count; ++pos) {
    bool ok;
    if (!mask[pos]) {
      ok = sameFloat(dev.e[pos], hst.e[pos]) && sameFloat(dev.out[pos], hst.out[pos]);
    } else {
      const double eTol = 1e-4 * (bound[pos] + std::fabs(in.e0[pos]));
      const double oTol = 1e-4 * scale * bound[pos] + 2 * dtypeEps(dt) * std::fabs(hst.out[pos]) + 1e-7;
      ok = std::fabs(double(dev.e[pos]) - hst.e[pos]) <= eTol &&
           std::fabs(double(dev.out[pos]) - hst.out[pos]) <= oTol;
    }
    if (!ok && reported++ < 10)
      ADD_FAILURE() << "position " << pos << (mask[pos] ? " (element)" : " (gap or padding)")
                    << ": E device " << dev.e[pos] << " host " << hst.e[pos] << ", out device "
                    << dev.out[pos] << " host " << hst.out[pos];
  }
}

class Pass3 : public ::testing::TestWithParam<PassCase> {};

TEST_P(Pass3, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Pass3Inputs in = pass3Inputs(c.k, c.dtype);
  const float scale = 2.f;
  const Pass3Result hst = runHostPass3(in, c.dtype, c.feedback, scale);
  {
    SCOPED_TRACE("checks == nullptr");
    expectPass3Close(in, c.dtype, scale, runDevicePass3(in, c.dtype, c.feedback, scale, nullptr, 0.f), hst);
  }
  {
    SCOPED_TRACE("checks pass: {0, expectedOp}");
    const float checks[2] = {0.f, 4.f};
    expectPass3Close(in, c.dtype, scale, runDevicePass3(in, c.dtype, c.feedback, scale, checks, 4.f), hst);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Pass3, ::testing::ValuesIn(passCases()), passCaseName);

class Pass3RowBlocks : public ::testing::TestWithParam<PassCase> {};

// Pass 3 over row blocks (a block's rows end before its valid elements do): no row past the
// block's end is touched.
TEST_P(Pass3RowBlocks, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const size_t es = dtypeSize(c.dtype);
  std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
  // Every other tensor's second row block left out: its rows must stay as they were.
  std::vector<cu::BlockDesc> some;
  for (size_t i = 0; i < blocks.size(); ++i)
    if (i % 4 != 1) some.push_back(blocks[i]);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 27), kNaN);
  const std::vector<float> p = normal(b.pCount, 28, 0.3f), qt = normal(b.qCount, 29, 0.3f);
  const std::vector<uint8_t> out0 = toBytes(std::vector<float>(b.count, 777.f), c.dtype);

  std::vector<float> he = e0;
  std::vector<uint8_t> ho = out0;
  for (const cu::BlockDesc& d : some)
    host::decompressAndUpdateError(c.feedback ? he.data() + d.offset : nullptr, viewOf(d),
                                   p.data() + d.p, qt.data() + d.qt, int(d.k), 2.f,
                                   ho.data() + d.offset * es, c.dtype);
  DeviceArray<float> de(e0), dp(p), dq(qt);
  DeviceArray<uint8_t> dout(out0);
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(some.data(), some.size(), &tbl.t));
  CUDA_OK(cu::decompressAndUpdateError(tbl.t, c.feedback ? de.get() : nullptr, dp.get(), dq.get(),
                                       2.f, dout.get(), c.dtype, nullptr, 0.f, nullptr));
  const std::vector<float> ed = de.download(), od = toFloats(dout.download(), c.dtype),
                           oh = toFloats(ho, c.dtype);
  int reported = 0;
  for (uint64_t pos = 0; pos < b.count; ++pos) {
    const bool same = sameFloat(ed[pos], he[pos]) && sameFloat(od[pos], oh[pos]);
    const bool close = std::fabs(double(ed[pos]) - he[pos]) <= 1e-5 * (1 + std::fabs(he[pos])) &&
                       std::fabs(double(od[pos]) - oh[pos]) <=
                           1e-5 * (1 + std::fabs(oh[pos])) + 2 * dtypeEps(c.dtype) * std::fabs(oh[pos]);
    if (!same && !close && reported++ < 10)
      ADD_FAILURE() << "position " << pos << ": E device " << ed[pos] << " host " << he[pos]
                    << ", out device " << od[pos] << " host " << oh[pos];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, Pass3RowBlocks,
    ::testing::Values(PassCase{lowrankFloat32, 3, true}, PassCase{lowrankBfloat16, 32, false},
                      PassCase{lowrankFloat16, kMixedLarge, true}, PassCase{lowrankFloat32, 40, true}),
    passCaseName);

class Pass3Checks : public ::testing::TestWithParam<PassCase> {};

// A call not to be trusted: every element of out is NaN and of E zero; nothing else is touched.
TEST_P(Pass3Checks, UntrustedCallGivesNaNAndDropsTheResidual) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Pass3Inputs in = pass3Inputs(c.k, c.dtype);
  const std::vector<char> mask = elementMask(in.b);
  const std::vector<float> out0 = toFloats(in.out0, c.dtype);
  const float bad[][2] = {{3.f, 4.f}, {0.f, 2.f}, {kNaN, 4.f}, {0.f, kNaN}};
  for (const auto& checks : bad) {
    SCOPED_TRACE("checks {" + std::to_string(checks[0]) + ", " + std::to_string(checks[1]) + "}");
    const Pass3Result dev = runDevicePass3(in, c.dtype, c.feedback, 1.f, checks, 4.f);
    int reported = 0;
    for (uint64_t pos = 0; pos < in.b.count; ++pos) {
      const bool ok = mask[pos] ? std::isnan(dev.out[pos]) && (c.feedback ? dev.e[pos] == 0.f
                                                                           : sameFloat(dev.e[pos], in.e0[pos]))
                                : sameFloat(dev.out[pos], out0[pos]) && sameFloat(dev.e[pos], in.e0[pos]);
      if (!ok && reported++ < 10)
        ADD_FAILURE() << "position " << pos << (mask[pos] ? " (element)" : " (gap)") << ": out "
                      << dev.out[pos] << ", E " << dev.e[pos];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, Pass3Checks,
    ::testing::Values(PassCase{lowrankFloat32, 4, true}, PassCase{lowrankFloat32, 40, false},
                      PassCase{lowrankFloat16, 1, true}, PassCase{lowrankBfloat16, 32, true},
                      PassCase{lowrankBfloat16, kMixedLarge, true}),
    passCaseName);

// ---------------------------------------------------------------------------------------------
// orthonormalize vs host::orthonormalize

struct OrthoMat {
  uint64_t n;
  uint32_t k;
  bool transposed;         // Qt layout (rowStride 1, colStride n) instead of P's (k, 1)
  int zeroCol = -1;        // this column all zero
  int dependentCol = -1;   // this column = 2 * column 0 (k <= 2) or column 0 + column 1
  bool allZero = false;
};

class Orthonormalize : public ::testing::TestWithParam<double> {};

// One table of matrices of both layouts, Gram-Schmidt and Householder sizes, zero and dependent
// columns. eps 0 makes the dependent-column rule decide alone (eps would hide it).
TEST_P(Orthonormalize, MatchesHostTwinOnOneTable) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<OrthoMat> mats = {
      {1, 1, false},   {5, 1, true},    {100, 2, false}, {2, 2, true},     {3, 3, false},
      {100, 4, true},  {1000, 8, false}, {64, 16, true}, {16, 16, false},  {300, 32, false},
      {200, 40, true}, {700, 3, true},
      {50, 1, false, 0},                      // zero column (Gram-Schmidt)
      {50, 2, true, 1},                       // zero second column (Gram-Schmidt)
      {60, 2, false, -1, 1},                  // dependent: column 1 = 2 column 0 (Gram-Schmidt)
      {80, 4, false, 2},                      // zero column (Householder)
      {80, 4, true, -1, 3},                   // dependent last column (Householder)
      {40, 5, false, -1, -1, true},           // all zero (Householder)
      {40, 2, true, -1, -1, true},            // all zero (Gram-Schmidt)
  };
  std::vector<cu::OrthoDesc> descs;
  uint64_t total = 3;
  for (const OrthoMat& m : mats) {
    cu::OrthoDesc d;
    d.offset = total;
    d.n = m.n;
    d.k = m.k;
    d.rowStride = m.transposed ? 1 : m.k;
    d.colStride = m.transposed ? m.n : 1;
    descs.push_back(d);
    total += m.n * m.k + 5;  // gaps between the matrices
  }
  std::vector<float> a = normal(total, 13);
  auto at = [&](size_t mi, uint64_t r, uint32_t j) -> float& {
    const cu::OrthoDesc& d = descs[mi];
    return a[d.offset + r * d.rowStride + j * d.colStride];
  };
  for (size_t mi = 0; mi < mats.size(); ++mi) {
    const OrthoMat& m = mats[mi];
    for (uint64_t r = 0; r < m.n; ++r) {
      if (m.allZero)
        for (uint32_t j = 0; j < m.k; ++j) at(mi, r, j) = 0.f;
      if (m.zeroCol >= 0) at(mi, r, m.zeroCol) = 0.f;
      if (m.dependentCol >= 0)
        at(mi, r, m.dependentCol) = m.k <= 2 ? 2.f * at(mi, r, 0) : at(mi, r, 0) + at(mi, r, 1);
    }
  }
  const double eps = GetParam();
  std::vector<float> h = a;
  for (const cu::OrthoDesc& d : descs)
    host::orthonormalize(h.data() + d.offset, d.n, int(d.k), d.rowStride, d.colStride, eps);

  DeviceArray<float> da(a);
  cu::OrthoTable* tbl = nullptr;
  CUDA_OK(cu::createOrthoTable(descs.data(), descs.size(), &tbl));
  CUDA_OK(cu::orthonormalize(tbl, da.get(), eps, nullptr));
  const std::vector<float> dv = da.download();
  cu::destroy(tbl);

  // Outside the matrices: untouched.
  std::vector<char> inside(total, 0);
  for (const cu::OrthoDesc& d : descs)
    for (uint64_t r = 0; r < d.n; ++r)
      for (uint32_t j = 0; j < d.k; ++j) inside[d.offset + r * d.rowStride + j * d.colStride] = 1;
  for (uint64_t i = 0; i < total; ++i)
    if (!inside[i]) {
      EXPECT_TRUE(sameFloat(dv[i], a[i])) << "gap element " << i << " was written";
    }

  for (size_t mi = 0; mi < mats.size(); ++mi) {
    const OrthoMat& m = mats[mi];
    const cu::OrthoDesc& d = descs[mi];
    SCOPED_TRACE("matrix " + std::to_string(mi) + ": n " + std::to_string(m.n) + ", k " +
                 std::to_string(m.k) + (m.transposed ? ", Qt layout" : ", P layout"));
    auto dq = [&](uint64_t r, uint32_t j) { return dv[d.offset + r * d.rowStride + j * d.colStride]; };
    auto hq = [&](uint64_t r, uint32_t j) { return h[d.offset + r * d.rowStride + j * d.colStride]; };
    // Householder on a dependent column: that column and the later ones are a completion of the
    // basis that rounding decides, so only the earlier ones are compared with the host.
    const uint32_t comparable = m.k > 2 && m.dependentCol >= 0 ? uint32_t(m.dependentCol) : m.k;
    int reported = 0;
    for (uint64_t r = 0; r < m.n; ++r)
      for (uint32_t j = 0; j < m.k; ++j) {
        ASSERT_TRUE(std::isfinite(dq(r, j))) << "row " << r << " col " << j;
        if (j < comparable && !(std::fabs(dq(r, j) - hq(r, j)) <= 2e-5) && reported++ < 10)
          ADD_FAILURE() << "row " << r << " col " << j << ": device " << dq(r, j) << ", host " << hq(r, j);
      }
    // Columns orthonormal (Gram-Schmidt's zeroed columns: zero).
    for (uint32_t i = 0; i < m.k; ++i)
      for (uint32_t j = 0; j <= i; ++j) {
        double dot = 0, hdot = 0;
        for (uint64_t r = 0; r < m.n; ++r) {
          dot += double(dq(r, i)) * dq(r, j);
          hdot += double(hq(r, i)) * hq(r, j);
        }
        const bool zeroed = m.k <= 2 && i == j && hdot < 0.5;  // the host zeroed it too
        EXPECT_NEAR(dot, i == j && !zeroed ? 1.0 : 0.0, 1e-5) << "columns " << i << ", " << j;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Orthonormalize, ::testing::Values(0.0, 1e-8),
                         [](const ::testing::TestParamInfo<double>& i) {
                           return i.param == 0 ? std::string("eps0") : std::string("eps1e8");
                         });

// ---------------------------------------------------------------------------------------------
// scatterQ, packExact / unpackExact, scale, setFloat

TEST(ScatterQ, CopiesUnlessTheChecksRejectTheCall) {
  SKIP_WITHOUT_DEVICE();
  const Buffer b = makeBuffer(standardTensors(), ksFor(kMixedSmall, 6));
  const ColBlocks cb = colBlocks(b);
  std::vector<uint64_t> dstOffset, dstLd;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    dstOffset.push_back(b.qOff[cb.tensor[bi]] + cb.c0[bi]);
    dstLd.push_back(b.t[cb.tensor[bi]].cols);
  }
  const std::vector<float> wire = hostToWire(cb, normal(cb.hostCount, 14), kNaN);
  const std::vector<float> qt0(b.qCount + 3, 5.f);
  std::vector<float> expected = qt0;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    for (uint32_t c = 0; c < d.k; ++c)
      for (uint32_t j = 0; j < d.cols; ++j) expected[dstOffset[bi] + c * dstLd[bi] + j] = wire[d.qt + c * d.qld + j];
  }
  cu::ScatterTable* tbl = nullptr;
  CUDA_OK(cu::createScatterTable(cb.d.data(), dstOffset.data(), dstLd.data(), cb.d.size(), &tbl));
  DeviceArray<float> dwire(wire);
  struct Case {
    const char* name;
    std::vector<float> checks;  // empty: no checks
    bool copies;
  };
  const Case cases[] = {{"no checks", {}, true},
                        {"checks pass", {0.f, 2.f}, true},
                        {"non-finite input", {1.f, 2.f}, false},
                        {"ops differ", {0.f, 3.f}, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DeviceArray<float> dqt(qt0), dchecks(c.checks.empty() ? std::vector<float>{0.f, 0.f} : c.checks);
    CUDA_OK(cu::scatterQ(tbl, dwire.get(), dqt.get(), c.checks.empty() ? nullptr : dchecks.get(),
                         2.f, nullptr));
    const std::vector<float> q = dqt.download();
    const std::vector<float>& want = c.copies ? expected : qt0;
    for (size_t i = 0; i < q.size(); ++i) ASSERT_TRUE(sameFloat(q[i], want[i])) << i;
  }
  cu::destroy(tbl);
}

class Exact : public ::testing::TestWithParam<lowrankDataType_t> {};

// The twins: phases::packExact (host::toFloat32, then countNonFinite of the float32 payload) and
// phases::unpackExact (host::fromFloat32 with the scale).
TEST_P(Exact, PackAndUnpackMatchTheHost) {
  SKIP_WITHOUT_DEVICE();
  const lowrankDataType_t dt = GetParam();
  const size_t es = dtypeSize(dt);
  const std::vector<cu::ExactDesc> runs = {
      {3, 1000, 2}, {2000, 1, 1005}, {2100, 4097, 1010}, {9000, 0, 6000}, {9001, 1025, 5200}};
  const uint64_t count = 10100, payloadCount = 6300;
  std::vector<float> gv = normal(count, 15);
  for (uint64_t i = 11; i < count; i += 97) gv[i] = i % 3 == 0 ? kNaN : i % 3 == 1 ? INFINITY : -INFINITY;
  gv[2500] = 1e30f;  // finite in float32, Inf in float16
  const std::vector<uint8_t> g = toBytes(gv, dt);

  std::vector<float> hp(payloadCount, kUnwritten);
  size_t hbad = 0;
  for (const cu::ExactDesc& r : runs) {
    host::toFloat32(g.data() + r.offset * es, dt, r.numel, hp.data() + r.exactOffset);
    hbad += host::countNonFinite(hp.data() + r.exactOffset, r.numel, lowrankFloat32);
  }
  cu::ExactTable* tbl = nullptr;
  CUDA_OK(cu::createExactTable(runs.data(), runs.size(), &tbl));
  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> dp(std::vector<float>(payloadCount, kUnwritten)), dbad(std::vector<float>{2.f});
  CUDA_OK(cu::packExact(tbl, dg.get(), dt, dp.get(), dbad.get(), nullptr));
  EXPECT_GT(hbad, 50u);
  EXPECT_EQ(dbad.download()[0], float(hbad) + 2.f);  // added to what was there
  expectSameFloats(dp.download(), hp, "payload");

  // Back: out = scale * payload in the dtype, everything between the runs untouched.
  const std::vector<float> payload = normal(payloadCount, 16, 100.f);
  std::vector<uint8_t> ho = toBytes(std::vector<float>(count, 3.f), dt);
  DeviceArray<uint8_t> dout(ho);
  for (const cu::ExactDesc& r : runs)
    host::fromFloat32(payload.data() + r.exactOffset, r.numel, 0.25f, ho.data() + r.offset * es, dt);
  dp.upload(payload);
  CUDA_OK(cu::unpackExact(tbl, dp.get(), 0.25f, dout.get(), dt, nullptr));
  const std::vector<uint8_t> od = dout.download();
  EXPECT_EQ(od, ho);  // the same rounding (nearest even) on both
  cu::destroy(tbl);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Exact, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<lowrankDataType_t>& i) {
                           return std::string(dtypeName(i.param));
                         });

TEST(Small, ScaleAndSetFloat) {
  SKIP_WITHOUT_DEVICE();
  std::vector<float> x = normal(100003, 17);
  DeviceArray<float> dx(x);
  CUDA_OK(cu::scale(dx.get(), x.size() - 1, 0.5f, nullptr));
  CUDA_OK(cu::setFloat(dx.get() + 7, 42.f, nullptr));
  const std::vector<float> d = dx.download();
  host::scale(x.data(), x.size() - 1, 0.5f);
  x[7] = 42.f;
  expectSameFloats(d, x, "x");
  CUDA_OK(cu::scale(dx.get(), 0, 0.5f, nullptr));  // nothing to do
}

// Tables without anything to do: every launch is a no-op that succeeds.
TEST(Small, EmptyTables) {
  SKIP_WITHOUT_DEVICE();
  cu::BlockTable* bt = nullptr;
  cu::ExactTable* et = nullptr;
  cu::OrthoTable* ot = nullptr;
  cu::ScatterTable* st = nullptr;
  CUDA_OK(cu::createBlockTable(nullptr, 0, &bt));
  CUDA_OK(cu::createExactTable(nullptr, 0, &et));
  CUDA_OK(cu::createOrthoTable(nullptr, 0, &ot));
  CUDA_OK(cu::createScatterTable(nullptr, nullptr, nullptr, 0, &st));
  CUDA_OK(cu::errorFeedbackAndP(bt, nullptr, lowrankFloat32, nullptr, nullptr, nullptr, nullptr, nullptr));
  CUDA_OK(cu::computeQ(bt, nullptr, lowrankFloat32, nullptr, nullptr, nullptr, nullptr));
  CUDA_OK(cu::decompressAndUpdateError(bt, nullptr, nullptr, nullptr, 1.f, nullptr, lowrankFloat32,
                                       nullptr, 0.f, nullptr));
  CUDA_OK(cu::orthonormalize(ot, nullptr, 0.0, nullptr));
  CUDA_OK(cu::packExact(et, nullptr, lowrankFloat32, nullptr, nullptr, nullptr));
  CUDA_OK(cu::unpackExact(et, nullptr, 1.f, nullptr, lowrankFloat32, nullptr));
  CUDA_OK(cu::scatterQ(st, nullptr, nullptr, nullptr, 0.f, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  cu::destroy(bt);
  cu::destroy(et);
  cu::destroy(ot);
  cu::destroy(st);
}

TEST(Small, RefusesOtherDtypes) {
  SKIP_WITHOUT_DEVICE();
  const Buffer b = makeBuffer({{4, 4, 4, 16}}, {1});
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(blocks.data(), blocks.size(), &tbl.t));
  DeviceArray<float> buf(std::vector<float>(64, 0.f));
  EXPECT_EQ(cu::errorFeedbackAndP(tbl.t, buf.get(), lowrankFloat64, nullptr, buf.get(), buf.get(),
                                  nullptr, nullptr),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------
// A whole call, in place (out = G), against the host twins in the same order

struct CallCase {
  lowrankDataType_t dtype;
  int k;
  bool feedback;
};

class FullCall : public ::testing::TestWithParam<CallCase> {};

TEST_P(FullCall, InPlaceMatchesHostTwins) {
  SKIP_WITHOUT_DEVICE();
  const CallCase c = GetParam();
  const size_t es = dtypeSize(c.dtype);
  const std::vector<Tensor> ts = {
      {37, 53, 53, 37 * 53}, {64, 1000, 1000, 64 * 1000}, {33, 300, 300, 33 * 300 - 250},
      {300, 17, 17, 300 * 17}, {20, 45, 64, 19 * 64 + 30}};
  const Buffer b = makeBuffer(ts, std::vector<uint32_t>(ts.size(), uint32_t(c.k)));
  const std::vector<cu::BlockDesc> rb = rowBlocks(b, INFINITY);
  const ColBlocks cb = colBlocks(b);
  const int N = 2;

  std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 18), kNaN), c.dtype);
  std::vector<float> e = fillElements(b, normal(b.count, 19, 0.1f), kNaN);
  std::vector<float> qt = normal(b.qCount, 20);
  for (size_t ti = 0; ti < ts.size(); ++ti)
    host::orthonormalize(qt.data() + b.qOff[ti], ts[ti].cols, c.k, 1, ts[ti].cols, 0.0);
  std::vector<cu::OrthoDesc> pDescs;
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    cu::OrthoDesc d;
    d.offset = b.pOff[ti], d.n = ts[ti].rows, d.k = uint32_t(c.k), d.rowStride = uint64_t(c.k), d.colStride = 1;
    pDescs.push_back(d);
  }
  std::vector<uint64_t> dstOffset, dstLd;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    dstOffset.push_back(b.qOff[cb.tensor[bi]] + cb.c0[bi]);
    dstLd.push_back(b.t[cb.tensor[bi]].cols);
  }

  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> de(e), dqt(qt), dp(std::vector<float>(b.pCount, kUnwritten)),
      dwire(std::vector<float>(cb.wireCount, kNaN)), dbad(std::vector<float>{0.f});

  // Host: the same steps as the engine, in place on g.
  std::vector<float>* he = c.feedback ? &e : nullptr;
  std::vector<float> p(b.pCount, kUnwritten), qh(cb.hostCount, kUnwritten);
  for (const cu::BlockDesc& d : rb)
    host::errorFeedbackAndP(g.data() + d.offset * es, c.dtype, he ? he->data() + d.offset : nullptr,
                            viewOf(d), qt.data() + d.qt, c.k, p.data() + d.p, d.limit);
  for (const cu::OrthoDesc& d : pDescs)
    host::orthonormalize(p.data() + d.offset, d.n, c.k, d.rowStride, d.colStride, 0.0);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    host::computeQ(g.data() + d.offset * es, c.dtype, he ? he->data() + d.offset : nullptr,
                   viewOf(d), p.data() + d.p, c.k, qh.data() + cb.hostQ[bi]);
  }
  host::scale(qh.data(), qh.size(), 1.f / N);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    host::decompressAndUpdateError(he ? he->data() + d.offset : nullptr, viewOf(d), p.data() + d.p,
                                   qh.data() + cb.hostQ[bi], c.k, 1.f, g.data() + d.offset * es,
                                   c.dtype);
  }
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    for (uint32_t cc = 0; cc < d.k; ++cc)
      for (uint32_t j = 0; j < d.cols; ++j)
        qt[dstOffset[bi] + cc * dstLd[bi] + j] = qh[cb.hostQ[bi] + size_t(cc) * d.cols + j];
  }

  // Device.
  BlockTableHolder t1, t2;
  cu::OrthoTable* ot = nullptr;
  cu::ScatterTable* st = nullptr;
  CUDA_OK(cu::createBlockTable(rb.data(), rb.size(), &t1.t));
  CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &t2.t));
  CUDA_OK(cu::createOrthoTable(pDescs.data(), pDescs.size(), &ot));
  CUDA_OK(cu::createScatterTable(cb.d.data(), dstOffset.data(), dstLd.data(), cb.d.size(), &st));
  float* dE = c.feedback ? de.get() : nullptr;
  CUDA_OK(cu::errorFeedbackAndP(t1.t, dg.get(), c.dtype, dE, dqt.get(), dp.get(), dbad.get(), nullptr));
  CUDA_OK(cu::orthonormalize(ot, dp.get(), 0.0, nullptr));
  CUDA_OK(cu::computeQ(t2.t, dg.get(), c.dtype, dE, dp.get(), dwire.get(), nullptr));
  CUDA_OK(cu::scale(dwire.get(), cb.wireCount, 1.f / N, nullptr));
  CUDA_OK(cu::decompressAndUpdateError(t2.t, dE, dp.get(), dwire.get(), 1.f, dg.get(), c.dtype,
                                       nullptr, 0.f, nullptr));
  CUDA_OK(cu::scatterQ(st, dwire.get(), dqt.get(), nullptr, 0.f, nullptr));
  const std::vector<float> gd = toFloats(dg.download(), c.dtype), gh = toFloats(g, c.dtype);
  const std::vector<float> ed = de.download(), qd = dqt.download();
  cu::destroy(ot);
  cu::destroy(st);
  EXPECT_EQ(dbad.download()[0], 0.f);

  // Per tensor: relative error of out, E and Qbar; gaps untouched.
  const std::vector<char> mask = elementMask(b);
  const double outTol = 1e-3 + 2 * dtypeEps(c.dtype);
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    double dOut = 0, nOut = 0, dE2 = 0, nE = 0, dQ = 0, nQ = 0;
    for (uint64_t r = 0; r < ts[ti].valid; ++r) {
      const uint64_t pos = b.offset[ti] + r;
      if (!mask[pos]) continue;
      dOut += double(gd[pos] - gh[pos]) * (gd[pos] - gh[pos]);
      nOut += double(gh[pos]) * gh[pos];
      dE2 += double(ed[pos] - e[pos]) * (ed[pos] - e[pos]);
      nE += double(e[pos]) * e[pos];
    }
    for (uint64_t i = b.qOff[ti]; i < b.qOff[ti] + uint64_t(c.k) * ts[ti].cols; ++i) {
      dQ += double(qd[i] - qt[i]) * (qd[i] - qt[i]);
      nQ += double(qt[i]) * qt[i];
    }
    EXPECT_LE(std::sqrt(dOut / nOut), outTol) << "out of tensor " << ti;
    EXPECT_LE(std::sqrt(dE2 / nE), 1e-3) << "E of tensor " << ti;
    EXPECT_LE(std::sqrt(dQ / nQ), 1e-3) << "Qbar of tensor " << ti;
  }
  for (uint64_t pos = 0; pos < b.count; ++pos)
    if (!mask[pos]) {
      EXPECT_TRUE(sameFloat(gd[pos], gh[pos])) << "out gap " << pos;
      EXPECT_TRUE(sameFloat(ed[pos], e[pos])) << "E gap " << pos;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, FullCall,
    ::testing::Values(CallCase{lowrankFloat32, 1, true}, CallCase{lowrankFloat32, 3, true},
                      CallCase{lowrankFloat32, 8, false}, CallCase{lowrankFloat16, 4, true},
                      CallCase{lowrankBfloat16, 8, true}, CallCase{lowrankBfloat16, 2, false}),
    [](const ::testing::TestParamInfo<CallCase>& i) {
      return std::string(dtypeName(i.param.dtype)) + "_k" + std::to_string(i.param.k) +
             (i.param.feedback ? "_ef" : "_noef");
    });

// ---------------------------------------------------------------------------------------------
// Determinism, and tables large enough for the wide tiles (device only: too slow emulated)

TEST(Determinism, SameInputsSameBits) {
  SKIP_WITHOUT_DEVICE();
  const Buffer b = makeBuffer(standardTensors(), ksFor(kMixedSmall, 6));
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 21), kNaN), lowrankFloat32);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 22, 0.1f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 23);
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
  Pass1Result d1, d2, h;
  runPass1(b, blocks, lowrankFloat32, true, g, e0, qt, &d1, &h);
  runPass1(b, blocks, lowrankFloat32, true, g, e0, qt, &d2, &h);
  expectSameFloats(d1.p, d2.p, "P of two runs");
  const ColBlocks cb = colBlocks(b);
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
  DeviceArray<float> de(e0), dp(d1.p), w1(std::vector<float>(cb.wireCount, 0.f)),
      w2(std::vector<float>(cb.wireCount, 0.f));
  CUDA_OK(cu::computeQ(tbl.t, nullptr, lowrankFloat32, de.get(), dp.get(), w1.get(), nullptr));
  CUDA_OK(cu::computeQ(tbl.t, nullptr, lowrankFloat32, de.get(), dp.get(), w2.get(), nullptr));
  expectSameFloats(w1.download(), w2.download(), "Qt of two runs");
}

#ifndef LOWRANK_CUDA_EMULATED_RUNTIME
class LargeTable : public ::testing::TestWithParam<int> {};

// Enough CUDA blocks that pass 1 takes chunks wider than the minimum and pass 2 slabs taller
// than the minimum (tables.cu), beside many small tensors.
TEST_P(LargeTable, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const int k = GetParam();
  std::vector<Tensor> ts = {{4096, 4099, 4099, 4096ull * 4099}, {3000, 5000, 5000, 3000ull * 5000 - 77}};
  for (int i = 0; i < 40; ++i) ts.push_back({uint32_t(50 + i), uint32_t(300 + 7 * i), uint64_t(300 + 7 * i), uint64_t(50 + i) * (300 + 7 * i)});
  const Buffer b = makeBuffer(ts, std::vector<uint32_t>(ts.size(), uint32_t(k)));
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 24), kNaN), lowrankBfloat16);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 25, 0.1f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 26);
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
  Pass1Result dev, hst;
  runPass1(b, blocks, lowrankBfloat16, true, g, e0, qt, &dev, &hst);
  if (HasFatalFailure()) return;
  expectSameFloats(dev.e, hst.e, "E");
  expectPClose(blocks, hst.e, qt, dev, hst, 1e-4);

  const ColBlocks cb = colBlocks(b);
  std::vector<float> qh(cb.hostCount, kUnwritten);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    host::computeQ(nullptr, lowrankFloat32, hst.e.data() + d.offset, viewOf(d), hst.p.data() + d.p,
                   k, qh.data() + cb.hostQ[bi]);
  }
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
  DeviceArray<float> de(hst.e), dp(hst.p), dwire(std::vector<float>(cb.wireCount, kUnwritten));
  CUDA_OK(cu::computeQ(tbl.t, nullptr, lowrankFloat32, de.get(), dp.get(), dwire.get(), nullptr));
  expectQClose(cb, hst.e, hst.p, wireToHost(cb, dwire.download(), kUnwritten), qh, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Kernels, LargeTable, ::testing::Values(1, 8, 32));
#endif

}  // namespace
