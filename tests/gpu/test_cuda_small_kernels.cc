// scatterQ, packExact / unpackExact, scale, setFloat, toWire / fromWire (16-bit factors), empty
// tables and refused dtypes.
#include "tests/gpu/kernel_test_support.h"
#include "util/convert.h"

namespace lowrank::gputest {
namespace {

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
      for (uint32_t j = 0; j < d.cols; ++j)
        expected[dstOffset[bi] + c * dstLd[bi] + j] = wire[d.qt + c * d.qld + j];
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
    DeviceArray<float> dqt(qt0),
        dchecks(c.checks.empty() ? std::vector<float>{0.f, 0.f} : c.checks);
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
  for (uint64_t i = 11; i < count; i += 97)
    gv[i] = i % 3 == 0 ? kNaN : i % 3 == 1 ? INFINITY : -INFINITY;
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
  DeviceArray<float> dp(std::vector<float>(payloadCount, kUnwritten)),
      dbad(std::vector<float>{2.f});
  CUDA_OK(cu::packExact(tbl, dg.get(), dt, dp.get(), dbad.get(), nullptr));
  EXPECT_GT(hbad, 50u);
  EXPECT_EQ(dbad.download()[0], float(hbad) + 2.f);  // added to what was there
  expectSameFloats(dp.download(), hp, "payload");

  // Back: out = scale * payload in the dtype, everything between the runs untouched.
  const std::vector<float> payload = normal(payloadCount, 16, 100.f);
  std::vector<uint8_t> ho = toBytes(std::vector<float>(count, 3.f), dt);
  DeviceArray<uint8_t> dout(ho);
  for (const cu::ExactDesc& r : runs)
    host::fromFloat32(payload.data() + r.exactOffset, r.numel, 0.25f, ho.data() + r.offset * es,
                      dt);
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

// 16-bit factors on the wire: toWire rounds as the host's toBf16 / toHalf (nearest even; ties,
// overflow to Inf in float16, subnormals, -0 included; a NaN a NaN), bit for bit, and fromWire
// gives back the host's toFloat of each word; other dtypes are refused.
TEST(Small, ToWireAndBackAsTheHostConverts) {
  SKIP_WITHOUT_DEVICE();
  std::vector<float> x = normal(70001, 23);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e5f;  // beyond float16's range
  for (size_t i = 3; i < x.size(); i += 11) x[i] *= 1e-6f;  // float16 subnormals
  const float specials[] = {0.f, -0.f, 1.f + 0x1p-8f, 1.f + 0x1p-11f, 1.f + 3 * 0x1p-8f, 65520.f,
                            65519.f, 3e38f, 1e-40f, INFINITY, -INFINITY, kNaN};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  DeviceArray<float> dx(x);
  DeviceArray<uint16_t> d16(x.size());
  for (lowrankDataType_t wire : {lowrankBfloat16, lowrankFloat16}) {
    SCOPED_TRACE(dtypeName(wire));
    CUDA_OK(cu::toWire(dx.get(), x.size() - 1, d16.get(), wire, nullptr));  // all but the last
    const std::vector<uint16_t> bits = d16.download();
    std::vector<float> want(x.size() - 1);
    for (size_t i = 0; i + 1 < x.size(); ++i) {
      const uint16_t h = wire == lowrankBfloat16 ? host::toBf16(x[i]).bits : host::toHalf(x[i]).bits;
      const auto decode = [&](uint16_t w) {
        return wire == lowrankBfloat16 ? host::toFloat(host::bf16_t{w}) : host::toFloat(host::half_t{w});
      };
      if (std::isnan(x[i])) {  // a NaN stays a NaN, payload aside (common.cuh)
        ASSERT_TRUE(std::isnan(decode(bits[i])));
      } else {
        ASSERT_EQ(bits[i], h) << "element " << i << " = " << x[i];
      }
      want[i] = decode(bits[i]);
    }
    DeviceArray<float> back(x.size());
    CUDA_OK(cu::fromWire(d16.get(), x.size() - 1, back.get(), wire, nullptr));
    std::vector<float> got = back.download();
    got.pop_back();
    expectSameFloats(got, want, "fromWire");
    CUDA_OK(cu::toWire(dx.get(), 0, d16.get(), wire, nullptr));  // nothing to do
  }
  EXPECT_EQ(cu::toWire(dx.get(), 4, d16.get(), lowrankFloat32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cu::fromWire(d16.get(), 4, dx.get(), lowrankInt8, nullptr), cudaErrorInvalidValue);
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
  CUDA_OK(cu::errorFeedbackAndP(bt, nullptr, lowrankFloat32, nullptr, nullptr, nullptr, nullptr,
                                nullptr));
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

TEST(Small, RefusesBlocksTooWide) {
  SKIP_WITHOUT_DEVICE();
  cu::BlockDesc d;
  d.rows = 1, d.cols = 0x80000000u, d.ld = d.cols, d.valid = d.cols, d.k = 1, d.qld = d.cols;
  cu::BlockTable* t = nullptr;
  EXPECT_EQ(cu::createBlockTable(&d, 1, &t), cudaErrorInvalidValue);
  EXPECT_EQ(t, nullptr);
  d.cols = 1, d.rows = 0x80000000u;
  EXPECT_EQ(cu::createBlockTable(&d, 1, &t), cudaErrorInvalidValue);
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

}  // namespace
}  // namespace lowrank::gputest
