// 16-bit factors on the wire (transport/wire.h): the encoding of a message, and every host
// algorithm, forced, with a 16-bit part: every rank holds the same bits, the part is within the
// bound its roundings allow of the exact sum, the rest is the exact float32 sum, and
// bytesSent is the cost model's count for that wire. The NCCL-style split (Transport::runSplit) is
// held by the engine's tests over the NCCL double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/transport/support.h"
#include "transport/ucx/cost_model.h"
#include "transport/wire.h"
#include "util/convert.h"

namespace lowrank::test {
namespace {

using ucx::Algorithm;

float roundTo(lowrankDataType_t t, float x) {
  return t == lowrankBfloat16 ? host::toFloat(host::toBf16(x)) : host::toFloat(host::toHalf(x));
}

TEST(WireFormat, BytesAndParts) {
  const Wire w{lowrankBfloat16, 10, 20};
  EXPECT_EQ(w.encodedIn(0, 10), 0u);
  EXPECT_EQ(w.encodedIn(5, 10), 5u);
  EXPECT_EQ(w.encodedIn(12, 3), 3u);
  EXPECT_EQ(w.encodedIn(18, 10), 2u);
  EXPECT_EQ(w.bytes(0, 30), 4u * 30 - 2 * 10);
  EXPECT_EQ(w.bytes(20, 5), 20u);
  EXPECT_EQ((Wire{lowrankFloat32, 0, 100}.bytes(0, 100)), 400u);  // float32: no 16-bit part
  EXPECT_FALSE((Wire{lowrankBfloat16, 5, 5}.active()));
}

// encode rounds the sender's copy, decode gives exactly those values; outside the part floats stay.
TEST(WireFormat, EncodeRoundsAndDecodes) {
  for (lowrankDataType_t t : {lowrankBfloat16, lowrankFloat16}) {
    const Wire w{t, 3, 9};
    std::vector<float> src = {0.1f, -1.3f, 3.3e-3f, 1.0001f, -7.77f, 65519.f, 1e5f, NAN, 1e-9f, 2.2f, 0.3f};
    const std::vector<float> orig = src;
    std::vector<std::byte> msg(w.bytes(1, 10));
    EXPECT_EQ(msg.size(), 4u * 2 + 2u * 6 + 4u * 2);
    wire::encode(w, 1, 10, src.data() + 1, msg.data());
    std::vector<float> dst(10, -1.f);
    wire::decode(w, 1, 10, msg.data(), dst.data());
    for (size_t i = 1; i < 11; ++i) {
      const bool part = i >= 3 && i < 9;
      const float want = part ? roundTo(t, orig[i]) : orig[i];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(dst[i - 1]) && std::isnan(src[i])) << i;
      } else {
        EXPECT_EQ(dst[i - 1], want) << wire::factorDtypeName(t) << " element " << i;
        EXPECT_EQ(src[i], want) << "the sender keeps what it sent, element " << i;
      }
    }
    EXPECT_EQ(src[0], orig[0]);  // outside the message
    if (t == lowrankFloat16) {
      EXPECT_TRUE(std::isinf(dst[5])) << "1e5 overflows float16";
    }
  }
}

// Inputs: the part uniform in [-1, 1] (inexact sums), the rest multiples of 1/4 (exact in any order).
std::vector<float> input(int rank, size_t count, const Wire& w, uint32_t seed) {
  std::mt19937 rng(seed * 977 + uint32_t(rank));
  std::uniform_real_distribution<float> u(-1, 1);
  std::uniform_int_distribution<int> q(-8, 8);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = i >= w.lo && i < w.hi ? u(rng) : 0.25f * float(q(rng));
  return x;
}

// Roundings an element of the part goes through on its way, at most: the ring one per hop; the
// others one per step of the reduce (log2 p), the fold's, the final one.
int roundings(Algorithm a, int n) {
  return a == Algorithm::Ring ? n : ucx::log2Floor(n) + 3;
}

void checkWire(std::vector<std::unique_ptr<Transport>>& g, Algorithm a, size_t count, const Wire& w,
               uint32_t seed) {
  const int n = int(g.size());
  std::vector<std::vector<float>> in(static_cast<size_t>(n)), bufs;
  std::vector<uint64_t> before;
  for (int r = 0; r < n; ++r) {
    in[size_t(r)] = input(r, count, w, seed);
    before.push_back(g[size_t(r)]->counters().bytesSent.load());
  }
  bufs = in;
  std::vector<Status> sts(static_cast<size_t>(n));
  runRanks(n, [&](int r) {
    sts[size_t(r)] = g[size_t(r)]->allreduce(bufs[size_t(r)].data(), count, lowrankFloat32, lowrankSum, w);
  });
  const double eps = w.dtype == lowrankBfloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const std::string what = std::string(ucx::algorithmName(a)) + " n " + std::to_string(n) + " count " +
                           std::to_string(count) + " part [" + std::to_string(w.lo) + ", " +
                           std::to_string(w.hi) + ") " + wire::factorDtypeName(w.dtype);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << what << ": " << sts[size_t(r)].msg;
    ASSERT_EQ(std::memcmp(bufs[size_t(r)].data(), bufs[0].data(), 4 * count), 0)
        << what << ": comm rank " << r << " differs from comm rank 0";
    EXPECT_EQ(g[size_t(r)]->counters().bytesSent.load() - before[size_t(r)],
              ucx::bytesSent(a, n, r, count, w))
        << what << ", comm rank " << r;
  }
  for (size_t i = 0; i < count; ++i) {
    double sum = 0, abs = 0;
    for (int r = 0; r < n; ++r) sum += in[size_t(r)][i], abs += std::fabs(in[size_t(r)][i]);
    const float got = bufs[0][i];
    if (i < w.lo || i >= w.hi) {
      ASSERT_EQ(double(got), sum) << what << ": element " << i << " outside the part is not exact";
    } else {
      ASSERT_LE(std::fabs(double(got) - sum), roundings(a, n) * eps * abs + 1e-7)
          << what << ": element " << i;
    }
  }
}

class WireEveryAlgorithm : public ::testing::TestWithParam<Algorithm> {};

TEST_P(WireEveryAlgorithm, SameBitsBoundedErrorBytesAsModelled) {
  const Algorithm a = GetParam();
  for (int n : {2, 3, 4, 5, 8}) {
    UcxTransportOptions o;
    o.algorithm = a;
    o.chunkBytes = 1000;  // not a multiple of 4 bytes' worth of parts: chunks cut the part anywhere
    auto g = makeGroup(n, 60, o);
    ASSERT_EQ(g.size(), size_t(n));
    uint32_t seed = 1;
    for (size_t count : {size_t(1), size_t(n) + 1, size_t(1001), size_t(4099)}) {
      for (lowrankDataType_t t : {lowrankBfloat16, lowrankFloat16}) {
        checkWire(g, a, count, Wire{t, 0, count}, seed++);                    // all of it
        if (count > 3) checkWire(g, a, count, Wire{t, count / 3, count - 2}, seed++);  // the payload's shape
        if (HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, WireEveryAlgorithm,
                         ::testing::Values(Algorithm::Ring, Algorithm::HalvingDoubling,
                                           Algorithm::RecursiveDoubling, Algorithm::Direct),
                         [](const ::testing::TestParamInfo<Algorithm>& i) {
                           std::string s = ucx::algorithmName(i.param);
                           s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
                           return s;
                         });

// The model's choice for a 16-bit part: never the ring beyond 2 comm ranks, whatever the size.
TEST(WireChoice, NoRingBeyondTwoRanks) {
  ucx::CostParams c;
  c.alphaSec = 1e-3;  // latency-bound links would still pick...
  c.betaSecPerByte = 8e-8;  // ...the ring for large buffers at 100 Mbit/s
  for (int n : {2, 3, 4, 8, 16})
    for (double bytes : {1e3, 1e6, 1e8}) {
      EXPECT_TRUE(ucx::roundsBounded(ucx::choose(n, bytes, c, 64, true), n)) << n << " " << bytes;
      if (n == 2) {
        EXPECT_EQ(ucx::choose(n, bytes, c, 64, true), ucx::choose(n, bytes, c, 64, false));
      }
    }
}

// Bad wires are refused before anything moves, and the transport is not broken by them.
TEST(WireChoice, BadWireRefused) {
  auto g = makeGroup(2, 10);
  ASSERT_EQ(g.size(), 2u);
  std::vector<float> x(8, 1.f);
  EXPECT_EQ(g[0]->allreduce(x.data(), 8, lowrankFloat32, lowrankSum, Wire{lowrankFloat64, 0, 4}).code,
            lowrankInvalidArgument);
  EXPECT_EQ(g[0]->allreduce(x.data(), 8, lowrankFloat32, lowrankSum, Wire{lowrankBfloat16, 4, 9}).code,
            lowrankInvalidArgument);
  EXPECT_EQ(g[0]->allreduce(x.data(), 4, lowrankFloat16, lowrankSum, Wire{lowrankBfloat16, 0, 2}).code,
            lowrankInvalidArgument);
  EXPECT_FALSE(g[0]->broken());
}

}  // namespace
}  // namespace lowrank::test
