// 16-bit factors on the wire (lowrankConfig_t.factorDtype, LOWRANK_FACTOR_DTYPE; docs/design.md,
// "16-bit factors") through the C API: bytes per call as the transport's model of the 16-bit part,
// at most 0.52 of float32 factors' beside the exact part; results near float32 factors' and the
// same bits on every rank; ranks that disagree fail together; the setting and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "support/ranks.h"
#include "transport/ucx/cost_model.h"
#include "transport/wire.h"
#include "support/env.h"

using namespace lowrank::testing;

namespace {

// Two matrices and a bias, per tensor.
constexpr size_t kN0 = 24, kM0 = 40, kN1 = 16, kM1 = 30, kBias = 16;
constexpr size_t kCount = kN0 * kM0 + kN1 * kM1 + kBias;

void setLayout(lowrankComm_t comm, const void* buf) {
  const size_t s0[] = {kN0, kM0}, s1[] = {kN1, kM1}, s2[] = {kBias};
  const size_t* shapes[] = {s0, s1, s2};
  const int ndims[] = {2, 2, 1};
  ASSERT_EQ(lowrankBufferSetLayout(comm, buf, 3, ndims, shapes), lowrankSuccess);
}

lowrankConfig_t factors(lowrankDataType_t t, bool alternate = false, int k = 2) {
  lowrankConfig_t c = config(k);
  c.factorDtype = t;
  c.alternate = alternate;
  c.pipeline = 0;
  c.seed = 3;
  return c;
}

// Each comm rank's own config (the same group).
void withRankConfigs(const std::vector<lowrankConfig_t>& cfgs,
                     const std::function<void(int, lowrankComm_t)>& body) {
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  const int n = int(cfgs.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      lowrankComm_t comm = nullptr;
      lowrankConfig_t cf = cfgs[size_t(r)];
      ASSERT_EQ(lowrankCommInitRankConfig(&comm, n, id, r, &cf), lowrankSuccess)
          << lowrankGetLastError(nullptr);
      body(r, comm);
      EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
    });
  for (auto& t : threads) t.join();
}

// Bytes each compressed call sends: the transport's model of its allreduces with the 16-bit part
// (halving + doubling forced: 4 ranks). The ratio to float32 factors' at ResNet-50's shapes: the
// perf binary (docs/design.md, "16-bit factors").
TEST(FactorDtype, BytesPerCallAsModelled) {
  using lowrank::Wire;
  using lowrank::ucx::Algorithm;
  const int N = 4, k = 2;
  const size_t P = (kN0 + kN1) * k, Q = (kM0 + kM1) * k;
  EnvGuard algo("LOWRANK_UCX_ALGO", "halving_doubling");
  for (bool alternate : {false, true})
    for (lowrankDataType_t t : {lowrankFloat32, lowrankBfloat16, lowrankFloat16}) {
      withComms(N, [&](int r, lowrankComm_t comm) {
        std::vector<float> buf(kCount), g = gaussian(kCount, 9 + r);
        setLayout(comm, buf.data());
        lowrankStats_t before, after;
        for (int c = 0; c < 5; ++c) {
          ASSERT_EQ(lowrankGetStats(comm, &before), lowrankSuccess);
          ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                                     nullptr), lowrankSuccess) << lowrankGetLastError(comm);
          ASSERT_EQ(lowrankGetStats(comm, &after), lowrankSuccess);
          if (c == 0) continue;  // the plan check rides the first call
          uint64_t model;
          if (alternate) {
            const size_t f = c % 2 == 0 ? P : Q;
            model = lowrank::ucx::bytesSent(Algorithm::HalvingDoubling, N, r, kBias + f + 2,
                                            Wire{t, kBias, kBias + f});
          } else {
            model = lowrank::ucx::bytesSent(Algorithm::HalvingDoubling, N, r, kBias + P + 2,
                                            Wire{t, kBias, kBias + P}) +
                    lowrank::ucx::bytesSent(Algorithm::HalvingDoubling, N, r, Q, Wire{t, 0, Q});
          }
          EXPECT_EQ(after.bytesSent - before.bytesSent, model)
              << lowrank::wire::factorDtypeName(t) << (alternate ? " alternating" : "") << ", call "
              << c + 1 << ", comm rank " << r;
        }
      }, factors(t, alternate, k));
    }
}

double relDist(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * double(a[i] - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / n);
}

// Five calls with error feedback: every rank the same bits; near float32 factors' (bfloat16 keeps
// 8 bits: the outputs differ by about 2^-8 relative, and not by nothing: the option took effect);
// float16 closer than bfloat16. The ring is left to the model (4 ranks: never chosen for it).
TEST(FactorDtype, NearFloat32FactorsSameBitsEverywhere) {
  const int N = 4, calls = 5;
  for (bool alternate : {false, true}) {
    std::vector<std::vector<std::vector<float>>> out(3, std::vector<std::vector<float>>(N));
    const lowrankDataType_t types[] = {lowrankFloat32, lowrankBfloat16, lowrankFloat16};
    for (int ti = 0; ti < 3; ++ti)
      withComms(N, [&](int r, lowrankComm_t comm) {
        std::vector<float> buf(kCount);
        setLayout(comm, buf.data());
        std::vector<float> all;
        for (int c = 0; c < calls; ++c) {
          std::vector<float> g = gaussian(kCount, 100 * c + 11 + r);
          ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankAvg, comm,
                                     nullptr), lowrankSuccess) << lowrankGetLastError(comm);
          all.insert(all.end(), buf.begin(), buf.end());
        }
        out[size_t(ti)][size_t(r)] = all;
      }, factors(types[ti], alternate));
    for (int ti = 0; ti < 3; ++ti)
      for (int r = 1; r < N; ++r)
        ASSERT_EQ(std::memcmp(out[size_t(ti)][size_t(r)].data(), out[size_t(ti)][0].data(),
                              4 * out[size_t(ti)][0].size()), 0)
            << lowrank::wire::factorDtypeName(types[ti]) << ": comm rank " << r << " differs";
    const double bf = relDist(out[1][0], out[0][0]), fp = relDist(out[2][0], out[0][0]);
    const char* what = alternate ? "alternating" : "PowerSGD";
    EXPECT_GT(bf, 1e-5) << what << ": bf16 factors changed nothing";
    EXPECT_LT(bf, 3e-2) << what;
    EXPECT_GT(fp, 1e-7) << what << ": fp16 factors changed nothing";
    EXPECT_LT(fp, bf) << what << ": fp16 keeps 3 more bits than bf16";
  }
}

// Error feedback keeps what the wire drops: after any calls, the outputs so far plus the mean of
// the ranks' residuals are the sum of the mean inputs (to float32 rounding), for both schedules.
// Alternating takes the residual from the rank's own factor: it must be the 16-bit one it sends
// (else the rounding, about 2^-9 of the factor, is lost from the sum); then with the direct
// algorithm (each contribution rounded once, summed in float32) nothing is lost. The other
// algorithms round partial sums on their way, which a rank's residual cannot see (design.md).
TEST(FactorDtype, ErrorFeedbackKeepsWhatTheWireDrops) {
  const int N = 2, calls = 4;
  EnvGuard algo("LOWRANK_UCX_ALGO", "direct");
  const size_t compressed = kN0 * kM0 + kN1 * kM1;  // the bias is exact: no residual
  for (bool alternate : {false, true}) {
    std::vector<std::vector<float>> residual(N);
    std::vector<double> sumOut(compressed, 0), sumIn(compressed, 0);
    withComms(N, [&](int r, lowrankComm_t comm) {
      std::vector<float> buf(kCount);
      setLayout(comm, buf.data());
      for (int c = 0; c < calls; ++c) {
        std::vector<float> g = gaussian(kCount, 100 * c + 31 + r);
        ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankAvg, comm,
                                   nullptr), lowrankSuccess) << lowrankGetLastError(comm);
        if (r == 0)
          for (size_t i = 0; i < compressed; ++i) sumOut[i] += buf[i];
        static std::mutex mu;
        std::lock_guard<std::mutex> lk(mu);
        for (size_t i = 0; i < compressed; ++i) sumIn[i] += g[i] / double(N);
      }
      size_t size = 0;
      ASSERT_EQ(lowrankBufferSaveState(comm, buf.data(), nullptr, &size), lowrankSuccess);
      std::vector<unsigned char> b(size);
      ASSERT_EQ(lowrankBufferSaveState(comm, buf.data(), b.data(), &size), lowrankSuccess);
      lowrank::SavedTensors st;
      ASSERT_TRUE(lowrank::decode(b.data(), b.size(), &st).ok());
      for (int t = 0; t < 2; ++t)
        residual[size_t(r)].insert(residual[size_t(r)].end(), st.tensors[size_t(t)].residual.begin(),
                                   st.tensors[size_t(t)].residual.end());
    }, factors(lowrankBfloat16, alternate));
    ASSERT_EQ(residual[0].size(), compressed);
    double d = 0, n = 0;
    for (size_t i = 0; i < compressed; ++i) {
      const double meanE = (double(residual[0][i]) + residual[1][i]) / N;
      d += (sumOut[i] + meanE - sumIn[i]) * (sumOut[i] + meanE - sumIn[i]);
      n += sumIn[i] * sumIn[i];
    }
    EXPECT_LT(std::sqrt(d / n), 1e-5) << (alternate ? "alternating" : "PowerSGD");
  }
}

// float16 factors overflow at 65504: a call whose inputs could make a factor message Inf falls back
// to an exact allreduce on every rank (as a NaN input does), where bfloat16 factors (float32's range)
// compress the same inputs. An input of 1e3 is far below float32's bound and above float16's
// (65504 / (16 N k sqrt(40)) at N 2, k 2: about 162).
TEST(FactorDtype, Float16FactorsThatCouldOverflowGoExact) {
  for (lowrankDataType_t t : {lowrankFloat16, lowrankBfloat16}) {
    withComms(2, [&](int r, lowrankComm_t comm) {
      std::vector<float> buf(kCount), g = gaussian(kCount, 41 + r);
      for (size_t i = 0; i < 10; ++i) g[i] *= 1e3f;
      setLayout(comm, buf.data());
      ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                                 nullptr), lowrankSuccess) << lowrankGetLastError(comm);
      lowrankStats_t st;
      ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
      for (float x : buf) ASSERT_TRUE(std::isfinite(x));
      EXPECT_EQ(st.fallbackCalls, t == lowrankFloat16 ? 1u : 0u) << lowrank::wire::factorDtypeName(t);
    }, factors(t));
  }
}

// A comm rank with other factors than its peers: every rank's first call fails (the plan check),
// none hangs, and the message names the factor dtype.
TEST(FactorDtype, RanksThatDisagreeFailTogether) {
  withRankConfigs({factors(lowrankBfloat16), factors(lowrankFloat32), factors(lowrankFloat32)},
                  [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount), g = gaussian(kCount, 5 + r);
    setLayout(comm, buf.data());
    EXPECT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                               nullptr), lowrankInvalidUsage) << "comm rank " << r;
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("factor dtype"), std::string::npos)
        << lowrankGetLastError(comm);
  });
}

TEST(FactorDtype, SettingAndRefusals) {
  for (auto [word, t] : {std::pair<const char*, lowrankDataType_t>{"fp32", lowrankFloat32},
                         {"bf16", lowrankBfloat16}, {"fp16", lowrankFloat16},
                         {"bfloat16", lowrankBfloat16}, {"FP16", lowrankFloat16}}) {
    EnvGuard e("LOWRANK_FACTOR_DTYPE", word);
    lowrankConfig_t c = config();
    withComms(1, [&](int, lowrankComm_t comm) {
      lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
      ASSERT_EQ(lowrankCommGetConfig(comm, &got), lowrankSuccess);
      EXPECT_EQ(got.factorDtype, int(t)) << word;
    }, c);
    c.factorDtype = lowrankFloat32;  // the field wins over the environment
    withComms(1, [&](int, lowrankComm_t comm) {
      lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
      ASSERT_EQ(lowrankCommGetConfig(comm, &got), lowrankSuccess);
      EXPECT_EQ(got.factorDtype, int(lowrankFloat32)) << word;
    }, c);
  }
  lowrankUniqueId id;
  lowrankComm_t comm = nullptr;
  {
    EnvGuard e("LOWRANK_FACTOR_DTYPE", "fp8");
    lowrankConfig_t c = config();
    ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
    // a malformed environment variable is a usage error, as every other one's
    EXPECT_EQ(lowrankCommInitRankConfig(&comm, 1, id, 0, &c), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find("LOWRANK_FACTOR_DTYPE"), std::string::npos)
        << lowrankGetLastError(nullptr);
  }
  for (int bad : {int(lowrankFloat64), int(lowrankInt8), 99}) {
    lowrankConfig_t c = config();
    c.factorDtype = bad;
    ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
    EXPECT_EQ(lowrankCommInitRankConfig(&comm, 1, id, 0, &c), lowrankInvalidArgument) << bad;
    EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find("factorDtype"), std::string::npos)
        << lowrankGetLastError(nullptr);
    EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find("not " + std::to_string(bad)),
              std::string::npos) << lowrankGetLastError(nullptr);
  }
}

// A program built against the header before factorDtype (lowrankConfig_t of 80 bytes) still
// works: its config is read as far as its size (factorDtype from LOWRANK_FACTOR_DTYPE), and
// lowrankCommGetConfig writes no byte past it.
TEST(FactorDtype, OlderConfigSizeIsReadAndWrittenAsFarAsItGoes) {
  EnvGuard e("LOWRANK_FACTOR_DTYPE", "bf16");
  struct Older {
    lowrankConfig_t c;  // only its first 80 bytes are the program's
  };
  static_assert(offsetof(lowrankConfig_t, factorDtype) == 80, "the older struct's size");
  lowrankConfig_t c = config();
  c.size = 80;
  c.factorDtype = 12345;  // past the older struct: never read
  withComms(1, [&](int, lowrankComm_t comm) {
    Older got;
    std::memset(&got, 0xab, sizeof got);
    got.c.size = 80;
    got.c.magic = LOWRANK_CONFIG_MAGIC;
    ASSERT_EQ(lowrankCommGetConfig(comm, &got.c), lowrankSuccess) << lowrankGetLastError(comm);
    EXPECT_EQ(got.c.approxRank, c.approxRank);
    unsigned char tail[sizeof(lowrankConfig_t) - 80];
    std::memcpy(tail, reinterpret_cast<const unsigned char*>(&got.c) + 80, sizeof tail);
    for (unsigned char b : tail) EXPECT_EQ(b, 0xab) << "written past the caller's 80 bytes";
    lowrankConfig_t full = LOWRANK_CONFIG_INITIALIZER;
    ASSERT_EQ(lowrankCommGetConfig(comm, &full), lowrankSuccess);
    EXPECT_EQ(full.factorDtype, int(lowrankBfloat16)) << "the environment's, not the bytes past 80";
  }, c);
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  lowrankComm_t comm = nullptr;
  c.size = 84;  // neither size
  EXPECT_EQ(lowrankCommInitRankConfig(&comm, 1, id, 0, &c), lowrankInvalidArgument);
}

}  // namespace
