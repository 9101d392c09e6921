// Pass 2 (computeQ) against host::computeQ.
#include "tests/gpu/kernel_test_support.h"

namespace lowrank::gputest {
namespace {

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

}  // namespace
}  // namespace lowrank::gputest
