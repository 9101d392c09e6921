// The compressed allreduce through the C API, comm ranks as threads: exactness on rank-k sums,
// identical outputs on every rank, dtypes and ops, in-place, exact fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>

#include <unistd.h>

#include "engine/data.h"
#include "util/convert.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

// Sum over ranks of the inputs made by make(rank), in double.
template <typename F>
std::vector<double> exactSum(int n, size_t count, F make) {
  std::vector<double> s(count, 0.0);
  for (int r = 0; r < n; ++r) {
    std::vector<float> g = make(r);
    for (size_t i = 0; i < count; ++i) s[i] += g[i];
  }
  return s;
}

struct RankK {
  int nranks;
  size_t n, m;
  int k;
};

class ExactOnRankK : public ::testing::TestWithParam<RankK> {};

TEST_P(ExactOnRankK, MatchesTheExactMeanOnEveryRank) {
  const RankK c = GetParam();
  const size_t count = c.n * c.m;
  auto make = [&](int r) { return rankKInput(c.n, c.m, c.k, r); };
  const std::vector<double> ref = exactSum(c.nranks, count, make);
  double maxRef = 0;
  for (double x : ref) maxRef = std::max(maxRef, std::abs(x / c.nranks));
  std::vector<std::vector<float>> outs(c.nranks);
  withComms(c.nranks, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr),
              lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, out.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.rows, c.n);  // the input was built in the batched view
    EXPECT_EQ(v.ncompressed, 1);
    outs[r] = out;
  }, config(c.k));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    wrong += std::abs(outs[0][i] - ref[i] / c.nranks) > 1e-4 * maxRef;
  EXPECT_EQ(wrong, 0u);
  for (int r = 1; r < c.nranks; ++r)
    EXPECT_EQ(std::memcmp(outs[r].data(), outs[0].data(), count * 4), 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Sizes, ExactOnRankK,
                         ::testing::Values(RankK{1, 32, 32, 1}, RankK{2, 32, 64, 2}, RankK{3, 64, 64, 4},
                                           RankK{4, 128, 256, 8}, RankK{5, 100, 120, 3},
                                           RankK{8, 64, 128, 4}));

TEST(AllReduce, PerTensorLayoutExactOnRankKTensorsAndExactParts) {
  // Two rank-2 matrices and a bias: per-tensor mode must be exact on each, bias exact.
  const int N = 3, k = 2;
  const size_t n1 = 40, m1 = 60, n2 = 30, m2 = 50, nb = 17;
  const size_t count = n1 * m1 + n2 * m2 + nb;
  auto make = [&](int r) {
    std::vector<float> a = rankKInput(n1, m1, k, r, 3), b = rankKInput(n2, m2, k, r, 5),
                       c = gaussian(nb, 50 + r);
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), c.begin(), c.end());
    return a;
  };
  const std::vector<double> ref = exactSum(N, count, make);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf = make(r);
    size_t s1[] = {n1, m1}, s2[] = {n2, 5, 10}, s3[] = {nb};
    const size_t* shapes[] = {s1, s2, s3};
    int ndims[] = {2, 3, 1};
    ASSERT_EQ(lowrankBufferSetLayout(comm, buf.data(), 3, ndims, shapes), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(buf.data(), buf.data(), count, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.perTensor, 1);
    EXPECT_EQ(v.ntensors, 3);
    EXPECT_EQ(v.ncompressed, 2);
    for (size_t i = 0; i < count; ++i) ASSERT_NEAR(buf[i], ref[i], 1e-3 * (1 + std::abs(ref[i]))) << i;
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, 1u);
    EXPECT_EQ(st.compressedElements, n1 * m1 + n2 * m2);
    EXPECT_EQ(st.exactElements, nb);
    EXPECT_EQ(st.payloadElements, (n1 + m1) * k + (n2 + m2) * k + nb);
  }, config(k));
}

TEST(AllReduce, BitIdenticalOnAllRanksForEveryDtypeAndOp) {
  const int N = 4;
  const size_t n = 70, m = 90, count = n * m;
  for (lowrankDataType_t dt : {lowrankFloat32, lowrankFloat16, lowrankBfloat16})
    for (lowrankRedOp_t op : {lowrankSum, lowrankAvg}) {
      std::vector<std::vector<uint8_t>> outs(N);
      withComms(N, [&](int r, lowrankComm_t comm) {
        std::vector<float> g = decayingInput(n, m, r);
        std::vector<uint8_t> buf(count * 4);
        lowrank::host::half_t* h = reinterpret_cast<lowrank::host::half_t*>(buf.data());
        lowrank::host::bf16_t* b = reinterpret_cast<lowrank::host::bf16_t*>(buf.data());
        for (size_t i = 0; i < count; ++i) {
          if (dt == lowrankFloat32) std::memcpy(buf.data() + 4 * i, &g[i], 4);
          if (dt == lowrankFloat16) h[i] = lowrank::host::toHalf(g[i]);
          if (dt == lowrankBfloat16) b[i] = lowrank::host::toBf16(g[i]);
        }
        for (int call = 0; call < 3; ++call)
          ASSERT_EQ(lowrankAllReduce(buf.data(), buf.data(), count, dt, op, comm, nullptr), lowrankSuccess);
        outs[r] = buf;
      });
      for (int r = 1; r < N; ++r) EXPECT_EQ(outs[r], outs[0]) << "dtype " << dt << " op " << op;
    }
}

TEST(AllReduce, SumIsNTimesAvgAndInPlaceEqualsOutOfPlace) {
  const int N = 3;
  const size_t n = 50, m = 80, count = n * m;
  std::vector<float> avgOut, sumOut, inPlace;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(n, m, r), a(count), s(count), ip = g;
    ASSERT_EQ(lowrankAllReduce(g.data(), a.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g.data(), s.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(ip.data(), ip.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
    if (r == 0) { avgOut = a; sumOut = s; inPlace = ip; }
  });
  // Separate buffers start from the same state, so each is a first call.
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(sumOut[i], float(N) * avgOut[i]) << i;
  EXPECT_EQ(inPlace, avgOut);
}

TEST(AllReduce, OtherDtypesAndOpsAreExact) {
  const int N = 3;
  const size_t count = 1001;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<int32_t> x(count), y(count);
    for (size_t i = 0; i < count; ++i) x[i] = int32_t(i * (r + 1)) - 7;
    ASSERT_EQ(lowrankAllReduce(x.data(), y.data(), count, lowrankInt32, lowrankSum, comm, nullptr), lowrankSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], int32_t(i * 6) - 21);
    std::vector<float> f(count), g(count);
    for (size_t i = 0; i < count; ++i) f[i] = float(i % 13) * (r == 1 ? 2.f : 1.f);
    ASSERT_EQ(lowrankAllReduce(f.data(), g.data(), count, lowrankFloat32, lowrankMax, comm, nullptr), lowrankSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(g[i], float(i % 13) * 2.f);
    std::vector<double> d(count, 0.5 + r), e(count);
    ASSERT_EQ(lowrankAllReduce(d.data(), e.data(), count, lowrankFloat64, lowrankAvg, comm, nullptr), lowrankSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_DOUBLE_EQ(e[i], 1.5);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, 0u);
    EXPECT_EQ(st.exactElements, 3 * count);
  });
}

TEST(AllReduce, ApproxRankZeroAndStartIterAreExact) {
  const int N = 2;
  const size_t n = 64, m = 64, count = n * m;
  auto make = [&](int r) { return decayingInput(n, m, r); };
  const std::vector<double> ref = exactSum(N, count, make);
  lowrankConfig_t cfg = config(4);
  cfg.startIter = 2;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    for (int call = 0; call < 3; ++call) {
      ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
      double err = 0;
      for (size_t i = 0; i < count; ++i) err = std::max(err, std::abs(out[i] - ref[i]));
      if (call < 2) EXPECT_LT(err, 1e-5) << "warm-up call " << call << " must be exact";
      else EXPECT_GT(err, 1e-3) << "call 2 must be compressed";
    }
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, 1u);
  }, cfg);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_NEAR(out[i], ref[i], 1e-5);
  }, config(0));
}

TEST(AllReduce, NonFiniteOnOneRankGivesExactResultOnAllAndResetsState) {
  const int N = 3;
  const size_t n = 32, m = 48, count = n * m;
  auto make = [&](int r) { return decayingInput(n, m, r); };
  const std::vector<double> ref = exactSum(N, count, make);
  std::vector<std::vector<float>> firstOut(N), afterNaN(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    firstOut[r] = out;
    std::vector<float> bad = g;
    if (r == 1) { bad[5] = NAN; bad[77] = INFINITY; }
    ASSERT_EQ(lowrankAllReduce(bad.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    EXPECT_TRUE(std::isnan(out[5]));
    EXPECT_TRUE(std::isinf(out[77]));
    for (size_t i = 0; i < count; ++i)
      if (i != 5 && i != 77) {
        ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
      }
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.fallbackCalls, 1u);
    // The state was reset, not poisoned: the next call is a first call again, bit for bit.
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    afterNaN[r] = out;
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(afterNaN[r], firstOut[r]) << "rank " << r;
    for (float x : afterNaN[r]) ASSERT_TRUE(std::isfinite(x));
  }
}

}  // namespace

namespace {

// Finite but huge inputs would overflow P or Q: every rank falls back to the exact allreduce.
TEST(AllReduce, HugeFiniteInputsFallBackInsteadOfOverflowing) {
  for (int pipeline : {0, 1}) {
    lowrankConfig_t cfg = config(4);
    cfg.pipeline = pipeline;
    EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", pipeline ? "20000" : nullptr);
    withComms(2, [&](int, lowrankComm_t comm) {
      std::vector<float> g(256 * 256, 1e37f), out(g.size());
      ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), g.size(), lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
      for (float x : out) ASSERT_EQ(x, 1e37f);
      lowrankStats_t st;
      ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
      EXPECT_EQ(st.fallbackCalls, 1u);
      std::vector<float> small(g.size(), 1.f);  // the state was not poisoned
      ASSERT_EQ(lowrankAllReduce(small.data(), out.data(), g.size(), lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
      for (float x : out) ASSERT_NEAR(x, 1.f, 1e-4);
    }, cfg);
  }
}

// Sum on some ranks and avg on others: refused on every rank, for both schedules.
TEST(AllReduce, MixedSumAndAvgIsInvalidUsageOnEveryRank) {
  for (int pipeline : {0, 1}) {
    lowrankConfig_t cfg = config(4);
    cfg.pipeline = pipeline;
    EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", pipeline ? "2000" : nullptr);
    std::vector<lowrankResult_t> res(3);
    withComms(3, [&](int r, lowrankComm_t comm) {
      std::vector<float> g(100 * 100, 1.f);
      res[r] = lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32,
                                r == 2 ? lowrankAvg : lowrankSum, comm, nullptr);
      // All ranks refused together, so the communicator still works.
      EXPECT_EQ(lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess);
    }, cfg);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(res[r], lowrankInvalidUsage) << "pipeline " << pipeline << " rank " << r;
  }
}

}  // namespace

namespace {

// One comm rank cannot allocate a buffer's state: every rank agrees at plan time and allreduces
// that buffer exactly, call after call, with no hang and no error.
TEST(AllReduce, AllocationFailureOnOneRankFallsBackToExactOnEveryRank) {
  const int N = 3;
  const size_t n = 64, m = 96, count = n * m;
  auto make = [&](int r) { return decayingInput(n, m, r); };
  const std::vector<double> ref = exactSum(N, count, make);
  std::optional<EnvGuard> fail(std::in_place, "LOWRANK_TEST_FAIL_ALLOC", "1");
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    for (int call = 0; call < 3; ++call) {
      ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      for (size_t i = 0; i < count; ++i) ASSERT_NEAR(out[i], ref[i], 1e-4) << "rank " << r << " call " << call;
    }
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, 0u);
    EXPECT_EQ(st.calls, 3u);
    EXPECT_EQ(st.stateBytes, 0u) << "no rank keeps state for a buffer that is allreduced exactly";
    EXPECT_EQ(st.exactOnlyPlans, 1u) << "every rank counts the plan made exact-only, once";
  });
  fail.reset();
  // Without the fault the same calls are compressed.
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = make(r), out(count);
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, 1u);
    EXPECT_EQ(st.exactOnlyPlans, 0u);
  });
}

// In a process of its own (the log level is read once per process): comm rank 1 cannot allocate;
// exits 0 only if every rank counted the exact-only plan and rank 1's log has the WARN naming the
// buffer and `bytes`.
void failAllocAndFindWarn(int N, size_t n, size_t m, uint64_t bytes, const std::string& logPattern) {
  setenv("LOWRANK_TEST_FAIL_ALLOC", "1", 1);
  std::mutex mu;
  std::string want;
  int counted = 0;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(n, m, r), out(n * m);
    if (lowrankAllReduce(g.data(), out.data(), n * m, lowrankFloat32, lowrankSum, comm, nullptr) != lowrankSuccess)
      return;
    lowrankStats_t st;
    std::lock_guard<std::mutex> lock(mu);
    counted += lowrankGetStats(comm, &st) == lowrankSuccess && st.exactOnlyPlans == 1;
    if (r != 1) return;
    char line[256];
    snprintf(line, sizeof line, "LOWRANK WARN buffer %p: could not allocate %llu bytes of compression "
             "state (LOWRANK_TEST_FAIL_ALLOC)", static_cast<void*>(out.data()), (unsigned long long)bytes);
    want = line;
  });
  std::string path = logPattern;
  path.replace(path.find("%p"), 2, std::to_string(getpid()));
  std::ifstream f(path);
  const std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const bool found = !want.empty() && log.find(want) != std::string::npos;
  std::remove(path.c_str());
  fprintf(stderr, "%d of %d ranks counted the exact-only plan; %s\n", counted, N,
          found ? "the WARN names the buffer and the bytes" : ("no line \"" + want + "\" in:\n" + log).c_str());
  fflush(stderr);
  _exit(found && counted == N ? 0 : 1);
}

// The failing rank says which buffer lost its compression and how many bytes it could not get:
// the bytes a rank that could allocate holds for the same buffer (stateBytes).
TEST(AllReduce, AllocationFailureIsAWarnNamingTheBufferAndTheBytes) {
  const int N = 2;
  const size_t n = 64, m = 96;
  uint64_t held = 0;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = decayingInput(n, m, r), out(n * m);
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), n * m, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    if (r == 1) held = st.stateBytes;
  });
  ASSERT_GT(held, n * m * sizeof(float)) << "a residual at least";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, which reads LOWRANK_DEBUG
  const std::string log = ::testing::TempDir() + "lowrank_failalloc_%p.log";
  EnvGuard level("LOWRANK_DEBUG", "WARN"), file("LOWRANK_DEBUG_FILE", log.c_str());
  EXPECT_EXIT(failAllocAndFindWarn(N, n, m, held, log), ::testing::ExitedWithCode(0),
              "2 of 2 ranks counted the exact-only plan; the WARN names the buffer and the bytes");
}

}  // namespace
