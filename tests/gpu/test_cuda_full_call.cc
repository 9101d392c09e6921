// A whole call in place (out = G) against the host twins in the same order; determinism; tables
// large enough for the wide tiles (device only).
#include "tests/gpu/kernel_test_support.h"

namespace lowrank::gputest {
namespace {

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
  // k > 32: every tensor at least k wide; P of the first and Qt of the second go through
  // cuSOLVER's QR (the dense-QR path), the others through the one-block kernel.
  const std::vector<Tensor> ts =
      c.k > 32 ? std::vector<Tensor>{{1200, 80, 80, 1200 * 80},
                                      {45, 300, 300, 45 * 300 - 100},
                                      {64, 64, 64, 64 * 64}}
               : std::vector<Tensor>{{37, 53, 53, 37 * 53},
                                     {64, 1000, 1000, 64 * 1000},
                                     {33, 300, 300, 33 * 300 - 250},
                                     {300, 17, 17, 300 * 17},
                                     {20, 45, 64, 19 * 64 + 30}};
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
    d.offset = b.pOff[ti], d.n = ts[ti].rows, d.k = uint32_t(c.k), d.rowStride = uint64_t(c.k),
    d.colStride = 1;
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
  CUDA_OK(
      cu::errorFeedbackAndP(t1.t, dg.get(), c.dtype, dE, dqt.get(), dp.get(), dbad.get(), nullptr));
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
                      CallCase{lowrankBfloat16, 8, true}, CallCase{lowrankBfloat16, 2, false},
                      CallCase{lowrankFloat32, 40, true}),
    [](const ::testing::TestParamInfo<CallCase>& i) {
      return std::string(dtypeName(i.param.dtype)) + "_k" + std::to_string(i.param.k) +
             (i.param.feedback ? "_ef" : "_noef");
    });

// ---------------------------------------------------------------------------------------------
// Determinism, and tables large enough for the wide tiles (device only: too slow emulated)

TEST(Determinism, SameInputsSameBits) {
  SKIP_WITHOUT_DEVICE();
  const Buffer b = makeBuffer(standardTensors(), ksFor(kMixedSmall, 6));
  const std::vector<uint8_t> g =
      toBytes(fillElements(b, normal(b.count, 21), kNaN), lowrankFloat32);
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
  std::vector<Tensor> ts = {{4096, 4099, 4099, 4096ull * 4099},
                            {3000, 5000, 5000, 3000ull * 5000 - 77}};
  for (int i = 0; i < 40; ++i)
    ts.push_back({uint32_t(50 + i), uint32_t(300 + 7 * i), uint64_t(300 + 7 * i),
                  uint64_t(50 + i) * (300 + 7 * i)});
  const Buffer b = makeBuffer(ts, std::vector<uint32_t>(ts.size(), uint32_t(k)));
  const std::vector<uint8_t> g =
      toBytes(fillElements(b, normal(b.count, 24), kNaN), lowrankBfloat16);
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
}  // namespace lowrank::gputest
