// Pass 3 (decompressAndUpdateError) against host::decompressAndUpdateError, and the checks that
// turn an untrusted call into NaN.
#include "tests/gpu/kernel_test_support.h"

namespace lowrank::gputest {
namespace {

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
    host::decompressAndUpdateError(ef ? r.e.data() + d.offset : nullptr, viewOf(d),
                                   in.p.data() + d.p, in.qh.data() + in.cb.hostQ[bi], int(d.k),
                                   scale, out.data() + d.offset * es, dt);
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
      const double oTol =
          1e-4 * scale * bound[pos] + 2 * dtypeEps(dt) * std::fabs(hst.out[pos]) + 1e-7;
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
    expectPass3Close(in, c.dtype, scale,
                     runDevicePass3(in, c.dtype, c.feedback, scale, nullptr, 0.f), hst);
  }
  {
    SCOPED_TRACE("checks pass: {0, expectedOp}");
    const float checks[2] = {0.f, 4.f};
    expectPass3Close(in, c.dtype, scale,
                     runDevicePass3(in, c.dtype, c.feedback, scale, checks, 4.f), hst);
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
    const bool close =
        std::fabs(double(ed[pos]) - he[pos]) <= 1e-5 * (1 + std::fabs(he[pos])) &&
        std::fabs(double(od[pos]) - oh[pos]) <=
            1e-5 * (1 + std::fabs(oh[pos])) + 2 * dtypeEps(c.dtype) * std::fabs(oh[pos]);
    if (!same && !close && reported++ < 10)
      ADD_FAILURE() << "position " << pos << ": E device " << ed[pos] << " host " << he[pos]
                    << ", out device " << od[pos] << " host " << oh[pos];
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Pass3RowBlocks,
                         ::testing::Values(PassCase{lowrankFloat32, 3, true},
                                           PassCase{lowrankBfloat16, 32, false},
                                           PassCase{lowrankFloat16, kMixedLarge, true},
                                           PassCase{lowrankFloat32, 40, true}),
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
      const bool ok = mask[pos]
                          ? std::isnan(dev.out[pos]) &&
                                (c.feedback ? dev.e[pos] == 0.f : sameFloat(dev.e[pos], in.e0[pos]))
                          : sameFloat(dev.out[pos], out0[pos]) && sameFloat(dev.e[pos], in.e0[pos]);
      if (!ok && reported++ < 10)
        ADD_FAILURE() << "position " << pos << (mask[pos] ? " (element)" : " (gap)") << ": out "
                      << dev.out[pos] << ", E " << dev.e[pos];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Pass3Checks,
                         ::testing::Values(PassCase{lowrankFloat32, 4, true},
                                           PassCase{lowrankFloat32, 40, false},
                                           PassCase{lowrankFloat16, 1, true},
                                           PassCase{lowrankBfloat16, 32, true},
                                           PassCase{lowrankBfloat16, kMixedLarge, true}),
                         passCaseName);

}  // namespace
}  // namespace lowrank::gputest
