// Pass 1 (errorFeedbackAndP) against host::errorFeedbackAndP, non-finite counting included.
#include "tests/gpu/kernel_test_support.h"

namespace lowrank::gputest {
namespace {

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

}  // namespace
}  // namespace lowrank::gputest
