// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors") through the C API: the
// calls against an Eigen reference of the alternating step, rank-k inputs exact after the stated
// calls, one allreduce of the step's factor per call (bytes as the transport's model), the phase
// in the checkpoint and the plan check, the option and its refusals.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "support/ranks.h"
#include "transport/ucx/cost_model.h"
#include "support/env.h"

using namespace lowrank::testing;
using Mat = Eigen::MatrixXd;
using Bytes = std::vector<unsigned char>;

namespace {

// Two matrices and a bias, per tensor.
constexpr size_t kN0 = 24, kM0 = 40, kN1 = 16, kM1 = 30, kBias = 16;
constexpr size_t kCount = kN0 * kM0 + kN1 * kM1 + kBias;
constexpr size_t kRows[] = {kN0, kN1}, kCols[] = {kM0, kM1}, kOffset[] = {0, kN0 * kM0};

void setLayout(lowrankComm_t comm, const void* buf) {
  const size_t s0[] = {kN0, kM0}, s1[] = {kN1, kM1}, s2[] = {kBias};
  const size_t* shapes[] = {s0, s1, s2};
  const int ndims[] = {2, 2, 1};
  ASSERT_EQ(lowrankBufferSetLayout(comm, buf, 3, ndims, shapes), lowrankSuccess);
}

lowrankConfig_t alternating(int k) {
  lowrankConfig_t c = config(k);
  c.alternate = 1;
  c.seed = 5;
  return c;
}

Mat block(const std::vector<float>& x, size_t off, size_t n, size_t m) {
  Mat a(n, m);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) a(i, j) = x[off + i * m + j];
  return a;
}

Mat gaussianMat(size_t n, size_t m) {
  static unsigned seed = 77;
  const std::vector<float> x = gaussian(n * m, seed++);
  return block(x, 0, n, m);
}

Mat orth(const Mat& a) {  // an orthonormal basis of a's columns (the span is what matters)
  Eigen::HouseholderQR<Mat> qr(a);
  return qr.householderQ() * Mat::Identity(a.rows(), a.cols());
}

// The saved state of comm rank r, its first tensor's Q replaced by q0 (k x m0), as bytes: the
// start the reference takes too.
Bytes stateWithQ(const std::vector<Mat>& q0, int r, int N, int k) {
  lowrank::SavedTensors s;
  s.seed = 5;
  s.nranks = N;
  s.rank = r;
  s.errorFeedback = true;
  s.byPosition = true;
  for (size_t t = 0; t < 3; ++t) {
    lowrank::SavedTensor x;
    x.id = t;
    x.shape = t < 2 ? lowrank::Shape{kRows[t], kCols[t]} : lowrank::Shape{kBias};
    x.residual.assign(t < 2 ? kRows[t] * kCols[t] : kBias, 0.f);
    if (t < 2) {
      x.k = k;
      x.haveQ = true;
      for (int j = 0; j < k; ++j)
        for (size_t c = 0; c < kCols[t]; ++c) x.qt.push_back(float(q0[t](j, c)));
    }
    s.tensors.push_back(x);
  }
  Bytes b(lowrank::encodedSize(s));
  lowrank::encode(s, b.data());
  return b;
}

// N comm ranks, `calls` avg allreduces of decaying inputs, every output against the reference:
// per tensor, the P step (kept Q orthonormalized; P_i = M_i Q; E_i = M_i - P_i Q^T; out = Pbar Q^T)
// and the Q step (kept Pbar orthonormalized; Q_i = M_i^T P; E_i = M_i - P Q_i^T; out = P Qbar^T).
void againstReference(int pipeline) {
  const int N = 3, k = 2, calls = 6;
  EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", "200");  // pipelined: chunks cross tensors
  std::vector<Mat> q0 = {gaussianMat(k, kM0), gaussianMat(k, kM1)};
  std::vector<std::vector<std::vector<float>>> inputs(N), outs(N);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < calls; ++c) {
      std::vector<float> g = decayingInput(1, kCount, r, 3 + c);
      inputs[r].push_back(g);
    }
  lowrankConfig_t cfg = alternating(k);
  cfg.pipeline = pipeline;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    const Bytes b = stateWithQ(q0, r, N, k);
    ASSERT_EQ(lowrankBufferRestoreState(comm, buf.data(), b.data(), b.size()), lowrankSuccess)
        << lowrankGetLastError(comm);
    for (int c = 0; c < calls; ++c) {
      ASSERT_EQ(lowrankAllReduce(inputs[r][c].data(), buf.data(), kCount, lowrankFloat32,
                                 lowrankAvg, comm, nullptr), lowrankSuccess)
          << lowrankGetLastError(comm);
      outs[r].push_back(buf);
    }
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    if (pipeline) EXPECT_GE(v.chunks, 2u);
  }, cfg);
  for (size_t t = 0; t < 2; ++t) {
    const size_t n = kRows[t], m = kCols[t];
    std::vector<Mat> E(N, Mat::Zero(n, m));
    Mat Q = q0[t].transpose(), Pbar;  // m x k, n x k
    for (int c = 0; c < calls; ++c) {
      std::vector<Mat> M(N);
      for (int r = 0; r < N; ++r) M[r] = block(inputs[r][c], kOffset[t], n, m) + E[r];
      Mat out;
      if (c % 2 == 0) {  // P step
        const Mat Qh = orth(Q);
        Pbar = Mat::Zero(n, k);
        for (int r = 0; r < N; ++r) {
          const Mat P = M[r] * Qh;
          E[r] = M[r] - P * Qh.transpose();
          Pbar += P / N;
        }
        out = Pbar * Qh.transpose();
      } else {  // Q step
        const Mat Ph = orth(Pbar);
        Mat Qbar = Mat::Zero(m, k);
        for (int r = 0; r < N; ++r) {
          const Mat Qi = M[r].transpose() * Ph;
          E[r] = M[r] - Ph * Qi.transpose();
          Qbar += Qi / N;
        }
        out = Ph * Qbar.transpose();
        Q = Qbar;
      }
      for (int r = 0; r < N; ++r) {
        const Mat got = block(outs[r][c], kOffset[t], n, m);
        EXPECT_LE((got - out).norm(), 1e-4 * out.norm())
            << "tensor " << t << " call " << c << " comm rank " << r;
        if (r) EXPECT_EQ(0, std::memcmp(outs[r][c].data(), outs[0][c].data(), kCount * 4))
                   << "every comm rank has the same bits";
      }
    }
  }
  for (int c = 0; c < calls; ++c)  // the bias: exact, the mean
    for (size_t i = kCount - kBias; i < kCount; ++i) {
      double mean = 0;
      for (int r = 0; r < N; ++r) mean += inputs[r][c][i] / N;
      EXPECT_NEAR(outs[0][c][i], mean, 1e-5);
    }
}

TEST(Alternate, CallsMatchTheReference) { againstReference(0); }
TEST(Alternate, PipelinedCallsMatchTheReference) { againstReference(1); }

// Every rank's input is the same fixed matrix of rank k, or U C_r V^T with U and V shared (their
// mean has rank k; every residual stays in U's span). Docs/design.md, "Alternating factors":
// with error feedback, each pair of calls (P step, Q step) sums to twice the mean and leaves every
// residual zero, while a single call is not the mean (call 1 projects on a random Q); without
// it, every call from the second on is the mean.
TEST(Alternate, RankKInputsAreExactByPairsOfCalls) {
  const int N = 3, k = 3, calls = 6;
  const size_t n = 40, m = 56;
  for (int feedback : {1, 0})
    for (bool same : {true, false}) {
      std::vector<std::vector<float>> outs(calls);
      std::vector<double> residual(calls, 0.0);
      std::vector<float> mean(n * m, 0.f);
      for (int r = 0; r < N; ++r) {
        const std::vector<float> g = rankKInput(n, m, k, same ? 0 : r);
        for (size_t i = 0; i < n * m; ++i) mean[i] += g[i] / N;
      }
      lowrankConfig_t cfg = alternating(k);
      cfg.errorFeedback = feedback;
      withComms(N, [&](int r, lowrankComm_t comm) {
        const std::vector<float> g = rankKInput(n, m, k, same ? 0 : r);
        std::vector<float> buf(n * m);
        const size_t shape[] = {n, m};
        const size_t* shapes[] = {shape};
        const int nd[] = {2};
        ASSERT_EQ(lowrankBufferSetLayout(comm, buf.data(), 1, nd, shapes), lowrankSuccess);
        for (int c = 0; c < calls; ++c) {
          ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), n * m, lowrankFloat32, lowrankAvg, comm,
                                     nullptr), lowrankSuccess) << lowrankGetLastError(comm);
          if (r == 0) outs[c] = buf;
          if (r == 0 && feedback) {  // |E| / |G| of comm rank 0
            size_t size = 0;
            ASSERT_EQ(lowrankBufferSaveState(comm, buf.data(), nullptr, &size), lowrankSuccess);
            Bytes b(size);
            ASSERT_EQ(lowrankBufferSaveState(comm, buf.data(), b.data(), &size), lowrankSuccess);
            lowrank::SavedTensors st;
            ASSERT_TRUE(lowrank::decode(b.data(), b.size(), &st).ok());
            double e2 = 0, g2 = 0;
            for (size_t i = 0; i < n * m; ++i) {
              e2 += std::pow(st.tensors[0].residual[i], 2);
              g2 += std::pow(g[i], 2);
            }
            residual[c] = std::sqrt(e2 / g2);
          }
        }
      }, cfg);
      auto dist = [&](const std::vector<float>& a, double scale) {
        double d = 0, ref = 0;
        for (size_t i = 0; i < n * m; ++i) {
          d += std::pow(a[i] - scale * mean[i], 2);
          ref += std::pow(scale * mean[i], 2);
        }
        return std::sqrt(d / ref);
      };
      const std::string what = std::string(feedback ? "error feedback" : "no error feedback") +
                               (same ? ", same input" : ", shared spans");
      EXPECT_GT(dist(outs[0], 1), 1e-2) << what << ": call 1 projects on a random Q";
      if (!feedback) {
        for (int c = 1; c < calls; ++c) EXPECT_LT(dist(outs[c], 1), 1e-4) << what << ", call " << c + 1;
        continue;
      }
      for (int c = 0; c + 1 < calls; c += 2) {
        std::vector<float> two(n * m);
        for (size_t i = 0; i < n * m; ++i) two[i] = outs[c][i] + outs[c + 1][i];
        EXPECT_LT(dist(two, 2), 1e-4) << what << ", calls " << c + 1 << " and " << c + 2;
        EXPECT_GT(residual[c], 1e-2) << what << ", after the P step of call " << c + 1;
        EXPECT_LT(residual[c + 1], 1e-3) << what << ", after the Q step of call " << c + 2;
      }
      EXPECT_GT(dist(outs[2], 1), 1e-3) << what << ": call 3 is not yet the mean";
    }
}

// One allreduce per call, of [exact part | the step's factor | 2 checks]: the bytes the transport's
// model gives for that count, the algorithm forced; P and Q steps alternate.
TEST(Alternate, OneAllreduceOfTheStepsFactorPerCall) {
  const int N = 4, k = 2;
  EnvGuard algo("LOWRANK_UCX_ALGO", "ring");
  lowrankConfig_t cfg = alternating(k);
  cfg.pipeline = 0;
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
      const size_t factor = c % 2 == 0 ? (kN0 + kN1) * k : (kM0 + kM1) * k;
      EXPECT_EQ(after.bytesSent - before.bytesSent,
                lowrank::ucx::bytesSent(lowrank::ucx::Algorithm::Ring, N, r, kBias + factor + 2, 4))
          << "call " << c + 1;
      EXPECT_EQ(after.payloadElements - before.payloadElements, kBias + factor);
    }
  }, cfg);
}

Bytes save(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess);
  Bytes b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  return b;
}

lowrank::SavedTensors decoded(const Bytes& b) {
  lowrank::SavedTensors s;
  EXPECT_TRUE(lowrank::decode(b.data(), b.size(), &s).ok());
  return s;
}

// The phase is saved per tensor (with the kept P before a Q step); another k restarts the
// alternation with a P step; a buffer switched to PowerSGD and back restarts it too.
TEST(Alternate, PhaseIsSavedAndRestartsOnAChangeOfK) {
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount), g = gaussian(kCount, 19 + r);
    setLayout(comm, buf.data());
    auto call = [&] {
      ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                                 nullptr), lowrankSuccess) << lowrankGetLastError(comm);
    };
    call();
    lowrank::SavedTensors s = decoded(save(comm, buf.data()));
    ASSERT_EQ(s.tensors.size(), 3u);
    EXPECT_TRUE(s.tensors[0].qStep && s.tensors[1].qStep) << "after a P step, a Q step";
    EXPECT_EQ(s.tensors[0].p.size(), kN0 * 2);
    EXPECT_FALSE(s.tensors[2].qStep) << "an exact tensor has no phase";
    call();
    s = decoded(save(comm, buf.data()));
    EXPECT_FALSE(s.tensors[0].qStep);
    EXPECT_TRUE(s.tensors[0].p.empty());
    call();  // a Q step next; then the tensors are declared again at another k
    std::vector<lowrankTensor_t> ts(3);
    const size_t sizes[3][2] = {{kN0, kM0}, {kN1, kM1}, {kBias, 0}};
    for (int t = 0; t < 3; ++t) {
      ts[t].id = 100 + t;
      ts[t].ndims = t < 2 ? 2 : 1;
      ts[t].shape[0] = sizes[t][0];
      ts[t].shape[1] = sizes[t][1];
      ts[t].approxRank = t == 0 ? 3 : LOWRANK_RANK_DEFAULT;
    }
    ASSERT_EQ(lowrankBufferSetTensors(comm, buf.data(), 3, ts.data()), lowrankSuccess);
    call();
    s = decoded(save(comm, buf.data()));
    EXPECT_TRUE(s.tensors[0].qStep) << "restarted: that call was a P step";
    ASSERT_EQ(lowrankBufferSetAlternate(comm, buf.data(), 0), lowrankSuccess);
    call();
    s = decoded(save(comm, buf.data()));
    EXPECT_FALSE(s.tensors[0].qStep) << "PowerSGD keeps no phase";
  }, alternating(2));
}

// A rejected call (a non-finite input on one comm rank, seen in the last chunk's checks) is the
// exact allreduce on every rank, at a P step and at a Q step, pipelined, out of place and in place
// (were recvbuff written before the checks are in, the in-place input would be lost); the state
// restarts, so the next call is a P step.
TEST(Alternate, RejectedCallIsExactOnEveryRank) {
  EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", "200");  // several chunks
  const int N = 3;
  const size_t bad = kN0 * kM0 + kN1 * kM1 - 1;  // the last element of M: in the last chunk
  lowrankConfig_t pipelined = alternating(2);
  pipelined.pipeline = 1;
  for (int at : {0, 1})  // the rejected call: a P step, a Q step
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (at ? "Q step" : "P step")
                                        << (inPlace ? ", in place" : ", out of place"));
      withComms(N, [&](int r, lowrankComm_t comm) {
        std::vector<float> buf(kCount, -7.f);
        setLayout(comm, buf.data());
        lowrankBufferView_t v;
        for (int c = 0; c <= at; ++c) {
          std::vector<float> g = gaussian(kCount, 31 * c + r);
          if (c == at && r == 2) g[bad] = NAN;
          if (inPlace) buf = g;
          ASSERT_EQ(lowrankAllReduce(inPlace ? buf.data() : g.data(), buf.data(), kCount,
                                     lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess)
              << lowrankGetLastError(comm);
        }
        std::vector<double> sum(kCount, 0.0);
        for (int q = 0; q < N; ++q) {
          const std::vector<float> g = gaussian(kCount, 31 * at + q);
          for (size_t i = 0; i < kCount; ++i) sum[i] += g[i];
        }
        EXPECT_TRUE(std::isnan(buf[bad]));
        for (size_t i = 0; i < kCount; ++i)
          if (i != bad) ASSERT_NEAR(buf[i], sum[i], 1e-5) << "element " << i;
        lowrankStats_t st;
        ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
        EXPECT_EQ(st.fallbackCalls, 1u);
        std::vector<float> g = gaussian(kCount, 99 + r);
        ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                                   nullptr), lowrankSuccess) << lowrankGetLastError(comm);
        for (float x : buf) ASSERT_TRUE(std::isfinite(x));
        const lowrank::SavedTensors s = decoded(save(comm, buf.data()));
        EXPECT_TRUE(s.tensors[0].qStep) << "the state restarted: that call was a P step";
        ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
        EXPECT_GE(v.chunks, 2u) << "pipelined";
      }, pipelined);
    }
}

// Ranks at different phases, or with different schedules, fail the call together.
TEST(Alternate, RanksThatDisagreeFailTogether) {
  std::vector<Bytes> atQ(2);  // after one call: a Q step next
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount), g = gaussian(kCount, 29 + r);
    setLayout(comm, buf.data());
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                               nullptr), lowrankSuccess);
    atQ[r] = save(comm, buf.data());
  }, alternating(2));
  // Rank 1's state of the same call, but at a P step (its kept P dropped): only the phase differs.
  lowrank::SavedTensors s = decoded(atQ[1]);
  for (auto& t : s.tensors) {
    t.qStep = false;
    t.p.clear();
  }
  Bytes atP1(lowrank::encodedSize(s));
  lowrank::encode(s, atP1.data());
  withComms(2, [&](int r, lowrankComm_t comm) {  // rank 0 at a Q step, rank 1 at a P step
    std::vector<float> buf(kCount), g = gaussian(kCount, 29 + r);
    const Bytes& b = r == 0 ? atQ[r] : atP1;
    ASSERT_EQ(lowrankBufferRestoreState(comm, buf.data(), b.data(), b.size()), lowrankSuccess);
    setLayout(comm, buf.data());
    EXPECT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                               nullptr), lowrankInvalidUsage) << "comm rank " << r;
  }, alternating(2));
  withComms(2, [&](int r, lowrankComm_t comm) {  // rank 1 alone switches the buffer to PowerSGD
    std::vector<float> buf(kCount), g = gaussian(kCount, 29 + r);
    setLayout(comm, buf.data());
    if (r == 1) ASSERT_EQ(lowrankBufferSetAlternate(comm, buf.data(), 0), lowrankSuccess);
    EXPECT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                               nullptr), lowrankInvalidUsage) << "comm rank " << r;
  }, alternating(2));
}

// Per buffer: a buffer set to alternate on a PowerSGD communicator gives the bits of an
// alternating communicator's, and the environment sets the communicator's default.
TEST(Alternate, PerBufferAndEnvironmentGiveTheSameBits) {
  std::vector<std::vector<float>> viaComm(2), viaBuffer(2), viaEnv(2);
  auto run = [&](lowrankConfig_t cfg, bool perBuffer, std::vector<std::vector<float>>& out) {
    withComms(2, [&](int r, lowrankComm_t comm) {
      std::vector<float> buf(kCount), g = gaussian(kCount, 39 + r);
      setLayout(comm, buf.data());
      if (perBuffer) ASSERT_EQ(lowrankBufferSetAlternate(comm, buf.data(), 1), lowrankSuccess);
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankSum, comm,
                                   nullptr), lowrankSuccess) << lowrankGetLastError(comm);
      lowrankConfig_t got = LOWRANK_CONFIG_INITIALIZER;
      ASSERT_EQ(lowrankCommGetConfig(comm, &got), lowrankSuccess);
      EXPECT_EQ(got.alternate, perBuffer ? 0 : 1);
      out[r] = buf;
    }, cfg);
  };
  run(alternating(2), false, viaComm);
  lowrankConfig_t plain = alternating(2);
  plain.alternate = LOWRANK_CONFIG_UNDEF_INT;
  run(plain, true, viaBuffer);
  {
    EnvGuard env("LOWRANK_ALTERNATE", "1");
    run(plain, false, viaEnv);
  }
  EXPECT_EQ(viaComm, viaBuffer);
  EXPECT_EQ(viaComm, viaEnv);
}

TEST(Alternate, BadSettingsAreRefused) {
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  lowrankComm_t comm = nullptr;
  lowrankConfig_t cfg = alternating(2);
  cfg.warmStart = 0;
  EXPECT_EQ(lowrankCommInitRankConfig(&comm, 1, id, 0, &cfg), lowrankInvalidArgument);
  EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find("warmStart"), std::string::npos);
  cfg = alternating(2);
  cfg.alternate = 2;
  EXPECT_EQ(lowrankCommInitRankConfig(&comm, 1, id, 0, &cfg), lowrankInvalidArgument);
  withComms(1, [&](int, lowrankComm_t c) {
    float x[4];
    EXPECT_EQ(lowrankBufferSetAlternate(c, x, 2), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferSetAlternate(c, nullptr, 1), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferSetAlternate(c, x, LOWRANK_ALTERNATE_DEFAULT), lowrankSuccess);
  }, config(2));
  lowrankConfig_t noWarm = config(2);
  noWarm.warmStart = 0;
  withComms(1, [&](int, lowrankComm_t c) {
    float x[4];
    EXPECT_EQ(lowrankBufferSetAlternate(c, x, 1), lowrankInvalidArgument);
  }, noWarm);
}

}  // namespace
