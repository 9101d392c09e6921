// The alternating PowerSGD kernels (kernels/cuda/alternate.cu; ACP-SGD, docs/design.md
// "Alternating factors") against their host twins: alternateStepP and alternateStepQ against
// host::alternateStepP / alternateStepQ (dtypes, k from 1 to 40 and mixed in one table, error
// feedback on and off, several blocks per tensor, padded and strided views, the non-finite
// count), decompressAlternate against host::decompressAndUpdateError without E (and its checks),
// and unitFactorIfRejected against its definition.
#include "tests/gpu/kernel_test_support.h"
#include "util/convert.h"

namespace lowrank::gputest {
namespace {

std::vector<PassCase> alternateCases() {
  std::vector<PassCase> v;
  for (lowrankDataType_t dt : kDtypes)
    for (int k : {1, 2, 4, 8, 32, 40, kMixedSmall, kMixedLarge})
      for (bool ef : {true, false}) v.push_back({dt, k, ef});
  return v;
}

// M = float(G) + E0 (E0 where error feedback is on), at element positions.
std::vector<float> mOf(const std::vector<uint8_t>& g, lowrankDataType_t dt,
                       const std::vector<float>& e0, bool ef) {
  std::vector<float> m = toFloats(g, dt);
  if (ef)
    for (size_t i = 0; i < m.size(); ++i) m[i] += e0[i];
  return m;
}

// The residual of a step: at element positions within tol of the host's, scaled by |M_ij| and
// the bound of (P Q^T)_ij (bound[pos]); elsewhere (gaps, padding) untouched, the same bits.
void expectResidualClose(const Buffer& b, const std::vector<float>& dev,
                         const std::vector<float>& hst, const std::vector<float>& m,
                         const std::vector<double>& bound, double tol) {
  const std::vector<char> mask = elementMask(b);
  int reported = 0;
  for (uint64_t pos = 0; pos < b.count; ++pos) {
    const bool ok = mask[pos] ? std::fabs(double(dev[pos]) - hst[pos]) <=
                                    tol * (std::fabs(m[pos]) + bound[pos]) + 1e-30
                              : sameFloat(dev[pos], hst[pos]);
    if (!ok && reported++ < 10)
      ADD_FAILURE() << "E at " << pos << (mask[pos] ? " (element)" : " (gap or padding)")
                    << ": device " << dev[pos] << ", host " << hst[pos];
  }
}

class AlternateStepP : public ::testing::TestWithParam<PassCase> {};

TEST_P(AlternateStepP, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const size_t es = dtypeSize(c.dtype);
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 41), kNaN), c.dtype);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 42, 0.3f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 43, 0.2f);
  const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);

  std::vector<float> he = e0, hp(b.pCount, kUnwritten);
  size_t hbad = 0;
  for (const cu::BlockDesc& d : blocks)
    hbad += host::alternateStepP(g.data() + d.offset * es, c.dtype,
                                 c.feedback ? he.data() + d.offset : nullptr, viewOf(d),
                                 qt.data() + d.qt, int(d.k), hp.data() + d.p, d.limit);

  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> de(e0), dq(qt), dp(std::vector<float>(b.pCount, kUnwritten)),
      dbad(std::vector<float>{0.f});
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(blocks.data(), blocks.size(), &tbl.t));
  CUDA_OK(cu::alternateStepP(tbl.t, dg.get(), c.dtype, c.feedback ? de.get() : nullptr, dq.get(),
                             dp.get(), dbad.get(), nullptr));
  Pass1Result dev, hst;
  dev.e = de.download();
  dev.p = dp.download();
  dev.bad = dbad.download()[0];
  hst.e = he;
  hst.p = hp;
  EXPECT_EQ(dev.bad, 0.f);
  EXPECT_EQ(hbad, 0u);
  const std::vector<float> m = mOf(g, c.dtype, e0, c.feedback);
  expectPClose(blocks, m, qt, dev, hst, 1e-4);
  // The rounding of P_ic is at most a few ulps of |M_i| |Q_c| (the dot product's terms), and E_ij
  // takes it times Q_cj: bound[pos] = |M_i| sum_c |Q_c| |Q_cj|.
  std::vector<double> bound(b.count, 0.0);
  for (const cu::BlockDesc& d : blocks) {
    std::vector<double> rowNorm(d.rows, 0.0), qNorm(d.k, 0.0);
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t) { rowNorm[i] += double(m[pos]) * m[pos]; });
    for (uint32_t cc = 0; cc < d.k; ++cc)
      for (uint32_t j = 0; j < d.cols; ++j)
        qNorm[cc] += double(qt[d.qt + cc * d.qld + j]) * qt[d.qt + cc * d.qld + j];
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t j) {
      double s = 0;
      for (uint32_t cc = 0; cc < d.k; ++cc)
        s += std::sqrt(qNorm[cc]) * std::fabs(qt[d.qt + cc * d.qld + j]);
      bound[pos] = std::sqrt(rowNorm[i]) * s;
    });
  }
  expectResidualClose(b, dev.e, hst.e, m, bound, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AlternateStepP, ::testing::ValuesIn(alternateCases()),
                         passCaseName);

class AlternateStepQ : public ::testing::TestWithParam<PassCase> {};

TEST_P(AlternateStepQ, MatchesHostTwin) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const size_t es = dtypeSize(c.dtype);
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 51), kNaN), c.dtype);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 52, 0.3f), kNaN);
  const std::vector<float> p = normal(b.pCount, 53, 0.2f);
  ColBlocks cb = colBlocks(b);
  for (cu::BlockDesc& d : cb.d) d.limit = INFINITY;

  std::vector<float> he = e0, qh(cb.hostCount, kUnwritten);
  size_t hbad = 0;
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    hbad += host::alternateStepQ(g.data() + d.offset * es, c.dtype,
                                 c.feedback ? he.data() + d.offset : nullptr, viewOf(d),
                                 p.data() + d.p, int(d.k), qh.data() + cb.hostQ[bi], d.limit);
  }

  DeviceArray<uint8_t> dg(g);
  DeviceArray<float> de(e0), dp(p), dwire(std::vector<float>(cb.wireCount, kUnwritten)),
      dbad(std::vector<float>{0.f});
  BlockTableHolder tbl;
  CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
  CUDA_OK(cu::alternateStepQ(tbl.t, dg.get(), c.dtype, c.feedback ? de.get() : nullptr, dp.get(),
                             dwire.get(), dbad.get(), nullptr));
  const std::vector<float> qd = wireToHost(cb, dwire.download(), kUnwritten);
  EXPECT_EQ(dbad.download()[0], 0.f);
  EXPECT_EQ(hbad, 0u);
  const std::vector<float> m = mOf(g, c.dtype, e0, c.feedback);
  expectQClose(cb, m, p, qd, qh, 1e-4);
  // Likewise: Q_jc rounds within a few ulps of |M_:j| |P_c|, and E_ij takes it times P_ic:
  // bound[pos] = |M_:j| sum_c |P_c| |P_ic|.
  std::vector<double> bound(b.count, 0.0);
  for (size_t bi = 0; bi < cb.d.size(); ++bi) {
    const cu::BlockDesc& d = cb.d[bi];
    std::vector<double> colNorm(d.cols, 0.0), pNorm(d.k, 0.0);
    forEachElement(d, [&](uint64_t pos, uint64_t, uint64_t j) { colNorm[j] += double(m[pos]) * m[pos]; });
    for (uint32_t cc = 0; cc < d.k; ++cc)
      for (uint32_t i = 0; i < d.rows; ++i)
        pNorm[cc] += double(p[d.p + size_t(i) * d.k + cc]) * p[d.p + size_t(i) * d.k + cc];
    forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t j) {
      double s = 0;
      for (uint32_t cc = 0; cc < d.k; ++cc)
        s += std::sqrt(pNorm[cc]) * std::fabs(p[d.p + i * d.k + cc]);
      bound[pos] = std::sqrt(colNorm[j]) * s;
    });
  }
  expectResidualClose(b, de.download(), he, m, bound, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AlternateStepQ, ::testing::ValuesIn(alternateCases()),
                         passCaseName);

// 16-bit factors (the steps' `wire`): each step's own factor comes out as the wire carries it
// (every value a bfloat16 / float16 value), within one unit of the wire's last place of the host
// twin's (both round nearly the same float), and the residual is taken from that rounded factor:
// E + P Q^T = M to float32 rounding (with the factor unrounded it would be off by about 2^-9
// |P| |Q|, a thousand times the tolerance).
class AlternateStepWire : public ::testing::TestWithParam<lowrankDataType_t> {};

TEST_P(AlternateStepWire, FactorRoundedBeforeTheResidual) {
  SKIP_WITHOUT_DEVICE();
  const lowrankDataType_t wire = GetParam();
  const auto onWire = [&](float x) {
    return wire == lowrankBfloat16 ? host::toFloat(host::toBf16(x)) : host::toFloat(host::toHalf(x));
  };
  const double ulp = wire == lowrankBfloat16 ? 0x1p-7 : 0x1p-10;  // relative, at worst
  const Buffer b = makeBuffer(standardTensors(), ksFor(kMixedSmall, 6));
  const std::vector<uint8_t> g = toBytes(fillElements(b, normal(b.count, 71), kNaN), lowrankFloat32);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 72, 0.3f), kNaN);
  const std::vector<float> m = mOf(g, lowrankFloat32, e0, true);
  const std::vector<char> mask = elementMask(b);
  // |E - (M - F)| within 1e-5 of |M| + |F|'s bound; F(pos) the rank-k product and its magnitude.
  const auto expectResidual = [&](const std::vector<float>& e, auto&& product, const char* what) {
    int reported = 0;
    for (uint64_t pos = 0; pos < b.count; ++pos) {
      if (!mask[pos]) continue;
      double f = 0, mag = 0;
      product(pos, &f, &mag);
      if (std::fabs(double(e[pos]) - (double(m[pos]) - f)) > 1e-5 * (std::fabs(m[pos]) + mag) + 1e-30 &&
          reported++ < 10)
        ADD_FAILURE() << what << ": E at " << pos << " = " << e[pos] << ", M - P Q^T = " << m[pos] - f;
    }
  };
  const auto expectFactor = [&](const std::vector<float>& dev, const std::vector<float>& hst,
                                const char* what) {
    int reported = 0;
    for (size_t i = 0; i < dev.size(); ++i) {
      if (hst[i] == kUnwritten) continue;
      const bool ok = dev[i] == onWire(dev[i]) &&
                      std::fabs(double(dev[i]) - hst[i]) <= ulp * std::fabs(hst[i]) + 1e-30;
      if (!ok && reported++ < 10)
        ADD_FAILURE() << what << "[" << i << "]: device " << dev[i] << ", host " << hst[i];
    }
  };

  {  // P step
    const std::vector<float> qt = normal(b.qCount, 73, 0.2f);
    const std::vector<cu::BlockDesc> blocks = rowBlocks(b, INFINITY);
    std::vector<float> he = e0, hp(b.pCount, kUnwritten);
    for (const cu::BlockDesc& d : blocks)
      host::alternateStepP(g.data() + d.offset * 4, lowrankFloat32, he.data() + d.offset,
                           viewOf(d), qt.data() + d.qt, int(d.k), hp.data() + d.p, d.limit, wire);
    DeviceArray<uint8_t> dg(g);
    DeviceArray<float> de(e0), dq(qt), dp(std::vector<float>(b.pCount, kUnwritten)),
        dbad(std::vector<float>{0.f});
    BlockTableHolder tbl;
    CUDA_OK(cu::createBlockTable(blocks.data(), blocks.size(), &tbl.t));
    CUDA_OK(cu::alternateStepP(tbl.t, dg.get(), lowrankFloat32, de.get(), dq.get(), dp.get(),
                               dbad.get(), nullptr, wire));
    const std::vector<float> p = dp.download(), e = de.download();
    expectFactor(p, hp, "P");
    std::vector<const cu::BlockDesc*> of(b.count, nullptr);
    std::vector<uint64_t> row(b.count, 0), col(b.count, 0);
    for (const cu::BlockDesc& d : blocks)
      forEachElement(d, [&](uint64_t pos, uint64_t i, uint64_t j) { of[pos] = &d; row[pos] = i; col[pos] = j; });
    expectResidual(e, [&](uint64_t pos, double* f, double* mag) {
      const cu::BlockDesc& d = *of[pos];
      for (uint32_t c = 0; c < d.k; ++c) {
        const double t = double(p[d.p + row[pos] * d.k + c]) * qt[d.qt + c * d.qld + col[pos]];
        *f += t;
        *mag += std::fabs(t);
      }
    }, "P step");
  }
  {  // Q step
    const std::vector<float> p = normal(b.pCount, 74, 0.2f);
    ColBlocks cb = colBlocks(b);
    for (cu::BlockDesc& d : cb.d) d.limit = INFINITY;
    std::vector<float> he = e0, qh(cb.hostCount, kUnwritten);
    for (size_t bi = 0; bi < cb.d.size(); ++bi) {
      const cu::BlockDesc& d = cb.d[bi];
      host::alternateStepQ(g.data() + d.offset * 4, lowrankFloat32, he.data() + d.offset,
                           viewOf(d), p.data() + d.p, int(d.k), qh.data() + cb.hostQ[bi], d.limit,
                           wire);
    }
    DeviceArray<uint8_t> dg(g);
    DeviceArray<float> de(e0), dp(p), dwire(std::vector<float>(cb.wireCount, kUnwritten)),
        dbad(std::vector<float>{0.f});
    BlockTableHolder tbl;
    CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
    CUDA_OK(cu::alternateStepQ(tbl.t, dg.get(), lowrankFloat32, de.get(), dp.get(), dwire.get(),
                               dbad.get(), nullptr, wire));
    const std::vector<float> q = wireToHost(cb, dwire.download(), kUnwritten), e = de.download();
    expectFactor(q, qh, "Q");
    std::vector<size_t> of(b.count, 0);
    std::vector<uint64_t> row(b.count, 0), col(b.count, 0);
    for (size_t bi = 0; bi < cb.d.size(); ++bi)
      forEachElement(cb.d[bi], [&](uint64_t pos, uint64_t i, uint64_t j) { of[pos] = bi; row[pos] = i; col[pos] = j; });
    expectResidual(e, [&](uint64_t pos, double* f, double* mag) {
      const cu::BlockDesc& d = cb.d[of[pos]];
      for (uint32_t c = 0; c < d.k; ++c) {
        const double t = double(p[d.p + row[pos] * d.k + c]) * q[cb.hostQ[of[pos]] + c * d.cols + col[pos]];
        *f += t;
        *mag += std::fabs(t);
      }
    }, "Q step");
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, AlternateStepWire,
                         ::testing::Values(lowrankBfloat16, lowrankFloat16),
                         [](const ::testing::TestParamInfo<lowrankDataType_t>& i) {
                           return std::string(dtypeName(i.param));
                         });

struct NonFiniteCase {
  lowrankDataType_t dtype;
  bool feedback;
};
class AlternateNonFinite : public ::testing::TestWithParam<NonFiniteCase> {};

// NaN, +-Inf and values at or above the limit are counted by both steps as the host counts them.
TEST_P(AlternateNonFinite, CountedAsTheHostCounts) {
  SKIP_WITHOUT_DEVICE();
  const NonFiniteCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(3, 6));
  const size_t es = dtypeSize(c.dtype);
  std::vector<float> gv = fillElements(b, normal(b.count, 61), kNaN);
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
  const std::vector<float> e0 = fillElements(b, normal(b.count, 62, 0.1f), kNaN);
  const std::vector<float> qt = normal(b.qCount, 63), p = normal(b.pCount, 64);
  const std::vector<cu::BlockDesc> rows = rowBlocks(b, 100.f);
  ColBlocks cb = colBlocks(b);
  for (cu::BlockDesc& d : cb.d) d.limit = 100.f;

  size_t hostP = 0, hostQ = 0;
  {
    std::vector<float> he = e0, hp(b.pCount);
    for (const cu::BlockDesc& d : rows)
      hostP += host::alternateStepP(g.data() + d.offset * es, c.dtype,
                                    c.feedback ? he.data() + d.offset : nullptr, viewOf(d),
                                    qt.data() + d.qt, int(d.k), hp.data() + d.p, d.limit);
  }
  {
    std::vector<float> he = e0, qh(cb.hostCount);
    for (size_t bi = 0; bi < cb.d.size(); ++bi) {
      const cu::BlockDesc& d = cb.d[bi];
      hostQ += host::alternateStepQ(g.data() + d.offset * es, c.dtype,
                                    c.feedback ? he.data() + d.offset : nullptr, viewOf(d),
                                    p.data() + d.p, int(d.k), qh.data() + cb.hostQ[bi], d.limit);
    }
  }
  EXPECT_GT(hostP, 10u);
  EXPECT_EQ(hostQ, hostP);
  DeviceArray<uint8_t> dg(g);
  {
    DeviceArray<float> de(e0), dq(qt), dp(std::vector<float>(b.pCount)),
        dbad(std::vector<float>{0.f});
    BlockTableHolder tbl;
    CUDA_OK(cu::createBlockTable(rows.data(), rows.size(), &tbl.t));
    CUDA_OK(cu::alternateStepP(tbl.t, dg.get(), c.dtype, c.feedback ? de.get() : nullptr,
                               dq.get(), dp.get(), dbad.get(), nullptr));
    EXPECT_EQ(dbad.download()[0], float(hostP)) << "P step";
  }
  {
    DeviceArray<float> de(e0), dp(p), dwire(std::vector<float>(cb.wireCount)),
        dbad(std::vector<float>{0.f});
    BlockTableHolder tbl;
    CUDA_OK(cu::createBlockTable(cb.d.data(), cb.d.size(), &tbl.t));
    CUDA_OK(cu::alternateStepQ(tbl.t, dg.get(), c.dtype, c.feedback ? de.get() : nullptr,
                               dp.get(), dwire.get(), dbad.get(), nullptr));
    EXPECT_EQ(dbad.download()[0], float(hostQ)) << "Q step";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, AlternateNonFinite,
    ::testing::Values(NonFiniteCase{lowrankFloat32, true}, NonFiniteCase{lowrankFloat32, false},
                      NonFiniteCase{lowrankFloat16, true}, NonFiniteCase{lowrankBfloat16, false}),
    [](const ::testing::TestParamInfo<NonFiniteCase>& i) {
      return std::string(dtypeName(i.param.dtype)) + (i.param.feedback ? "_ef" : "_noef");
    });

// The decompression without E, over column blocks (wire Qbar, the Q step's) and row blocks (the
// whole tensors' Qt, the P step's): out as the host's decompressAndUpdateError(nullptr, ...), E
// the same bits; on a call the checks reject, out NaN and E zero on every element (untouched
// without error feedback), gaps and padding untouched.
class DecompressAlternate : public ::testing::TestWithParam<PassCase> {};

TEST_P(DecompressAlternate, MatchesHostTwinAndHonoursTheChecks) {
  SKIP_WITHOUT_DEVICE();
  const PassCase c = GetParam();
  const Buffer b = makeBuffer(standardTensors(), ksFor(c.k, 6));
  const size_t es = dtypeSize(c.dtype);
  const ColBlocks cb = colBlocks(b);
  const std::vector<float> e0 = fillElements(b, normal(b.count, 71), kNaN);
  const std::vector<float> p = normal(b.pCount, 72, 0.3f), qh = normal(cb.hostCount, 73, 0.3f),
                           qt = normal(b.qCount, 74, 0.3f);
  const std::vector<uint8_t> out0 = toBytes(std::vector<float>(b.count, 777.f), c.dtype);
  const std::vector<char> mask = elementMask(b);
  const float scale = 3.f;
  const std::vector<cu::BlockDesc> rows = rowBlocks(b, INFINITY);

  for (bool byRows : {false, true}) {
    SCOPED_TRACE(byRows ? "row blocks (P step)" : "column blocks (Q step)");
    const std::vector<cu::BlockDesc>& blocks = byRows ? rows : cb.d;
    const std::vector<float> q = byRows ? qt : hostToWire(cb, qh, kNaN);
    std::vector<uint8_t> ho = out0;
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      const cu::BlockDesc& d = blocks[bi];
      host::decompressAndUpdateError(nullptr, viewOf(d), p.data() + d.p,
                                     byRows ? qt.data() + d.qt : qh.data() + cb.hostQ[bi],
                                     int(d.k), scale, ho.data() + d.offset * es, c.dtype);
    }
    const std::vector<float> oh = toFloats(ho, c.dtype);
    const std::vector<float> out0f = toFloats(out0, c.dtype);
    for (int rejected = 0; rejected < 2; ++rejected) {
      SCOPED_TRACE(rejected ? "rejected" : "trusted");
      const std::vector<float> checks = rejected ? std::vector<float>{2.f, 4.f}
                                                 : std::vector<float>{0.f, 4.f};
      DeviceArray<float> de(e0), dp(p), dq(q), dchecks(checks);
      DeviceArray<uint8_t> dout(out0);
      BlockTableHolder tbl;
      CUDA_OK(cu::createBlockTable(blocks.data(), blocks.size(), &tbl.t));
      CUDA_OK(cu::decompressAlternate(tbl.t, c.feedback ? de.get() : nullptr, dp.get(), dq.get(),
                                      scale, dout.get(), c.dtype, dchecks.get(), 4.f, nullptr));
      const std::vector<float> ed = de.download(), od = toFloats(dout.download(), c.dtype);
      int reported = 0;
      for (uint64_t pos = 0; pos < b.count; ++pos) {
        bool ok;
        if (!mask[pos])
          ok = sameFloat(ed[pos], e0[pos]) && sameFloat(od[pos], out0f[pos]);
        else if (rejected)
          ok = std::isnan(od[pos]) && (c.feedback ? ed[pos] == 0.f : sameFloat(ed[pos], e0[pos]));
        else
          ok = sameFloat(ed[pos], e0[pos]) &&
               std::fabs(double(od[pos]) - oh[pos]) <=
                   1e-5 * scale * (1 + std::fabs(oh[pos])) + 2 * dtypeEps(c.dtype) * std::fabs(oh[pos]);
        if (!ok && reported++ < 10)
          ADD_FAILURE() << "position " << pos << (mask[pos] ? " (element)" : " (gap)") << ": out "
                        << od[pos] << " (host " << oh[pos] << "), E " << ed[pos] << " (was "
                        << e0[pos] << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, DecompressAlternate,
                         ::testing::Values(PassCase{lowrankFloat32, 2, true},
                                           PassCase{lowrankFloat32, 40, false},
                                           PassCase{lowrankFloat16, kMixedSmall, true},
                                           PassCase{lowrankBfloat16, 8, false},
                                           PassCase{lowrankBfloat16, kMixedLarge, true}),
                         passCaseName);

// A rejected P step's factors become the first k unit vectors; a trusted call writes nothing.
TEST(UnitFactorIfRejected, WritesUnitVectorsOnlyOnRejection) {
  SKIP_WITHOUT_DEVICE();
  // Three P matrices (rows x k, row stride k) with a gap between them, and one Qt (k x m, column
  // stride m): n x k at offset, rowStride, colStride.
  const std::vector<cu::OrthoDesc> mats = {
      {3, 37, 3, 3, 1}, {3 + 37 * 3 + 5, 300, 1, 1, 1}, {500, 5, 2, 2, 1}, {600, 40, 4, 1, 40}};
  const size_t size = 800;
  const std::vector<float> base = normal(size, 81);
  cu::OrthoTable* t = nullptr;
  CUDA_OK(cu::createOrthoTable(mats.data(), mats.size(), &t));
  for (const auto& checks : {std::vector<float>{0.f, 2.f}, std::vector<float>{1.f, 2.f},
                             std::vector<float>{0.f, 4.f}, std::vector<float>{kNaN, 2.f}}) {
    const bool rejected = !(checks[0] == 0.f && checks[1] == 2.f);
    SCOPED_TRACE(rejected ? "rejected" : "trusted");
    DeviceArray<float> db(base), dc(checks);
    CUDA_OK(cu::unitFactorIfRejected(t, db.get(), dc.get(), 2.f, nullptr));
    std::vector<float> want = base;
    if (rejected)
      for (const cu::OrthoDesc& d : mats)
        for (uint64_t r = 0; r < d.n; ++r)
          for (uint32_t c = 0; c < d.k; ++c)
            want[d.offset + r * d.rowStride + c * d.colStride] = r == c ? 1.f : 0.f;
    expectSameFloats(db.download(), want, "factor");
  }
  cu::destroy(t);
}

}  // namespace
}  // namespace lowrank::gputest
