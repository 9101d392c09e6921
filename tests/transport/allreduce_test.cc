// Allreduce over the UCX transport, comm ranks as threads: every dtype x op, both algorithms,
// 1..8 ranks, odd counts; results equal a naive reference and are bitwise identical on all ranks;
// counters match the algorithms' volumes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "util/convert.h"
#include "tests/transport/support.h"
#include "util/dtype.h"

namespace lowrank::test {
namespace {

UcxTransportOptions ringOnly(size_t chunkBytes = 1 << 20, int inflight = 4) {
  UcxTransportOptions o;
  o.algorithm = ucx::Algorithm::Ring;
  o.chunkBytes = chunkBytes;
  o.inflight = inflight;
  return o;
}
UcxTransportOptions directOnly() {
  UcxTransportOptions o;
  o.algorithm = ucx::Algorithm::Direct;
  return o;
}

// Runs one allreduce of exact data on the whole group and checks every rank against the reference.
void checkExact(std::vector<std::unique_ptr<Transport>>& g, size_t count, lowrankDataType_t dt,
                lowrankRedOp_t op, uint32_t seed) {
  const int n = int(g.size());
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n)), bufs;
  for (int r = 0; r < n; ++r) in[size_t(r)] = exactData(dt, op, r, count, seed);
  auto ref = referenceReduce(in, count, dt, op);
  bufs = in;
  auto sts = allreduceAll(g, bufs, count, dt, op);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << sts[size_t(r)].msg;
    long d = firstDiff(bufs[size_t(r)], ref, dtypeSize(dt));
    ASSERT_EQ(d, -1) << dtypeName(dt) << " " << opName(op) << " count " << count << " n " << n
                     << ": comm rank " << r << " differs from the reference at element " << d;
  }
}

const lowrankDataType_t kTypes[] = {lowrankInt8, lowrankUint8, lowrankInt32, lowrankUint32,
                                    lowrankInt64, lowrankUint64, lowrankFloat16, lowrankFloat32,
                                    lowrankFloat64, lowrankBfloat16};
const lowrankRedOp_t kOps[] = {lowrankSum, lowrankProd, lowrankMax, lowrankMin, lowrankAvg};

TEST(Allreduce, EveryDtypeAndOpRingWithSmallChunks) {
  // 300-byte chunks, 2 in flight: many chunks per segment, so the pipeline and the tags are busy.
  auto g = makeGroup(3, 30, ringOnly(300, 2));
  ASSERT_EQ(g.size(), 3u);
  uint32_t seed = 1;
  for (auto dt : kTypes)
    for (auto op : kOps) {
      checkExact(g, 1001, dt, op, seed++);
      if (HasFatalFailure()) return;
    }
  // Ring: every rank sends 2(N-1)/N of each buffer, 2(N-1) * count over the group.
  EXPECT_EQ(elementsSent(g), uint64_t(50) * 2 * 2 * 1001);
}

TEST(Allreduce, EveryDtypeAndOpDirect) {
  auto g = makeGroup(4, 30, directOnly());
  ASSERT_EQ(g.size(), 4u);
  uint32_t seed = 100;
  for (auto dt : kTypes)
    for (auto op : kOps) {
      checkExact(g, 257, dt, op, seed++);
      if (HasFatalFailure()) return;
    }
  for (auto& t : g) EXPECT_EQ(t->counters().elementsSent.load(), uint64_t(50) * 3 * 257);
  for (auto& t : g) EXPECT_EQ(t->counters().messages.load(), uint64_t(50) * 3);
}

// 1..8 ranks, odd counts, the algorithm the cost model chooses: each rank sends what the model
// says that algorithm sends.
TEST(Allreduce, RanksAndCountsWithDefaultAlgorithms) {
  for (int n = 1; n <= 8; ++n) {
    auto g = makeGroup(n, 30);
    ASSERT_EQ(g.size(), size_t(n));
    std::vector<size_t> counts = {1, 7, 1001, 8192, 8193, 100003};
    if (n == 3 || n == 8) counts.push_back((size_t(1) << 20) + 3);
    for (size_t count : counts) {
      for (auto dt : {lowrankFloat32, lowrankBfloat16}) {
        std::vector<uint64_t> beforeRank;
        for (auto& t : g) beforeRank.push_back(t->counters().bytesSent.load());
        checkExact(g, count, dt, n % 2 ? lowrankSum : lowrankAvg, uint32_t(count + n));
        if (HasFatalFailure()) return;
        if (n == 1) continue;
        const auto algo = ucx::choose(n, double(count * dtypeSize(dt)), ucx::CostParams{}, 64);
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(g[size_t(r)]->counters().bytesSent.load() - beforeRank[size_t(r)],
                    ucx::bytesSent(algo, n, r, count, dtypeSize(dt)))
              << ucx::algorithmName(algo) << " n " << n << " count " << count;
      }
    }
  }
}

TEST(Allreduce, RingWithFewerElementsThanRanks) {
  auto g = makeGroup(8, 30, ringOnly());
  ASSERT_EQ(g.size(), 8u);
  for (size_t count : {1, 3, 7, 8, 9, 17}) {
    for (auto op : kOps) {
      checkExact(g, count, lowrankInt32, op, uint32_t(count));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Allreduce, TcpSelfTransports) {
  UcxTransportOptions o;
  o.tls = "tcp,self";
  o.chunkBytes = 64 * 1024;
  auto g = makeGroup(4, 30, o);
  ASSERT_EQ(g.size(), 4u);
  for (size_t count : {size_t(5), size_t(4000), (size_t(1) << 20) + 3}) {
    checkExact(g, count, lowrankFloat32, lowrankSum, 7);
    checkExact(g, count, lowrankFloat16, lowrankAvg, 8);
    checkExact(g, count, lowrankInt64, lowrankProd, 9);
    if (HasFatalFailure()) return;
  }
}

// Arbitrary floats: the sum is not exact, but every rank must hold the same bits, close to the sum.
TEST(Allreduce, RandomFloatsAreBitwiseIdenticalOnAllRanks) {
  for (bool ring : {false, true}) {
    const int n = 5;
    auto g = makeGroup(n, 30, ring ? ringOnly(4096) : directOnly());
    ASSERT_EQ(g.size(), size_t(n));
    for (auto dt : {lowrankFloat32, lowrankFloat64, lowrankFloat16}) {
      const size_t count = 20011;
      std::mt19937 rng(42);
      std::normal_distribution<double> nd(0, 100);
      std::vector<std::vector<double>> vals(n, std::vector<double>(count));
      std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(count * dtypeSize(dt)));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          double v = nd(rng);
          if (dt == lowrankFloat32) { float f = float(v); vals[r][i] = f; std::memcpy(&bufs[r][4 * i], &f, 4); }
          else if (dt == lowrankFloat64) { vals[r][i] = v; std::memcpy(&bufs[r][8 * i], &v, 8); }
          else { auto h = host::toHalf(float(v)); vals[r][i] = host::toFloat(h); std::memcpy(&bufs[r][2 * i], &h, 2); }
        }
      auto sts = allreduceAll(g, bufs, count, dt, lowrankSum);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(sts[r].ok()) << sts[r].msg;
        EXPECT_EQ(firstDiff(bufs[r], bufs[0], dtypeSize(dt)), -1) << "comm rank " << r;
      }
      double tol = dt == lowrankFloat16 ? 2e-3 : dt == lowrankFloat32 ? 1e-6 : 1e-14;
      for (size_t i = 0; i < count; ++i) {
        double ref = 0, mag = 0;
        for (int r = 0; r < n; ++r) { ref += vals[r][i]; mag += std::fabs(vals[r][i]); }
        double got = dt == lowrankFloat32   ? double(reinterpret_cast<float*>(bufs[0].data())[i])
                     : dt == lowrankFloat64 ? reinterpret_cast<double*>(bufs[0].data())[i]
                                            : host::toFloat(reinterpret_cast<host::half_t*>(bufs[0].data())[i]);
        ASSERT_NEAR(got, ref, tol * mag * n) << "element " << i;
      }
    }
  }
}

TEST(Allreduce, ManyCallsOfChangingShapeKeepInStep) {
  auto g = makeGroup(3, 30, ringOnly(1024, 3));
  ASSERT_EQ(g.size(), 3u);
  // Mixed sizes and dtypes back to back, ring only: any tag confusion between calls shows up here.
  for (uint32_t i = 0; i < 40; ++i) {
    size_t count = (i * 977) % 3001 + (i % 3 == 0 ? 0 : 1);
    checkExact(g, count, kTypes[i % 10], kOps[i % 5], i);
    if (HasFatalFailure()) return;
  }
}

TEST(Allreduce, CountZeroAndSingleRankSendNothing) {
  auto g1 = makeGroup(1, 10);
  ASSERT_EQ(g1.size(), 1u);
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  auto orig = v;
  ASSERT_TRUE(g1[0]->allreduce(v.data(), v.size(), lowrankFloat32, lowrankAvg).ok());
  ASSERT_TRUE(g1[0]->allreduce(v.data(), v.size(), lowrankFloat32, lowrankProd).ok());
  EXPECT_EQ(v, orig);
  EXPECT_EQ(g1[0]->counters().messages.load(), 0u);

  auto g = makeGroup(3, 10);
  ASSERT_EQ(g.size(), 3u);
  std::vector<std::vector<uint8_t>> bufs(3);
  auto sts = allreduceAll(g, bufs, 0, lowrankFloat32, lowrankSum);
  for (auto& st : sts) EXPECT_TRUE(st.ok()) << st.msg;
  EXPECT_EQ(elementsSent(g), 0u);
  for (auto& t : g) EXPECT_EQ(t->counters().messages.load(), 0u);
  checkExact(g, 10, lowrankInt32, lowrankSum, 3);  // still in step after the empty call
}

TEST(Allreduce, InvalidArguments) {
  auto g = makeGroup(1, 10);
  ASSERT_EQ(g.size(), 1u);
  float x = 0;
  EXPECT_EQ(g[0]->allreduce(&x, 1, lowrankNumTypes, lowrankSum).code, lowrankInvalidArgument);
  EXPECT_EQ(g[0]->allreduce(&x, 1, lowrankFloat32, lowrankNumOps).code, lowrankInvalidArgument);
  EXPECT_EQ(g[0]->allreduce(nullptr, 1, lowrankFloat32, lowrankSum).code, lowrankInvalidArgument);
  EXPECT_TRUE(g[0]->allreduce(&x, 1, lowrankFloat32, lowrankSum).ok());  // not failed by the above
}

}  // namespace
}  // namespace lowrank::test
