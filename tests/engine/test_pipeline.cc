// The pipelined schedule against the unpipelined one: same results to float rounding, identical
// bits on every rank, at chunk boundaries of every kind; many buffers; concurrent communicators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "engine/data.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

// Small chunks, so that small inputs are pipelined and cross many chunk boundaries.
struct ChunkEnv : lowrank::testing::EnvGuard {
  explicit ChunkEnv(const char* elems) : EnvGuard("LOWRANK_PIPELINE_CHUNK", elems) {}
};

struct Shape {
  std::vector<std::vector<size_t>> tensors;  // empty: batched
  size_t count;
};

// Runs `calls` allreduces (sum) of decaying inputs on N ranks; returns every rank's last output.
std::vector<std::vector<float>> run(int N, const Shape& sh, int k, int pipeline, int calls) {
  lowrankConfig_t cfg = config(k);
  cfg.pipeline = pipeline;
  std::vector<std::vector<float>> outs(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = gaussian(sh.count, 100 + r), buf(sh.count);
    std::vector<float> shared = decayingInput(1, sh.count, 0);  // one row: a shared signal
    for (size_t i = 0; i < sh.count; ++i) g[i] = 0.1f * g[i] + shared[i];
    if (!sh.tensors.empty()) {
      std::vector<int> nd;
      std::vector<const size_t*> shapes;
      for (auto& t : sh.tensors) {
        nd.push_back(int(t.size()));
        shapes.push_back(t.data());
      }
      ASSERT_EQ(lowrankBufferSetLayout(comm, buf.data(), int(nd.size()), nd.data(), shapes.data()),
                lowrankSuccess);
    }
    for (int c = 0; c < calls; ++c)
      ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), sh.count, lowrankFloat32, lowrankSum, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    if (pipeline) EXPECT_GE(v.chunks, 2u) << "the input must cross chunk boundaries";
    else EXPECT_EQ(v.chunks, 1u);  // one chunk per phase: the schedule without overlap
    outs[r] = buf;
  }, cfg);
  return outs;
}

void expectClose(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += std::pow(double(a[i]) - b[i], 2);
    n += std::pow(double(b[i]), 2);
  }
  EXPECT_LE(std::sqrt(d), rel * std::sqrt(n)) << "relative difference " << std::sqrt(d / n);
}

class PipelineVsSerial : public ::testing::TestWithParam<std::tuple<int, int, Shape>> {};

TEST_P(PipelineVsSerial, SameResultAndIdenticalOnEveryRank) {
  ChunkEnv env("500");
  auto [N, k, sh] = GetParam();
  auto serial = run(N, sh, k, 0, 3), piped = run(N, sh, k, 1, 3);
  for (int r = 1; r < N; ++r) {
    EXPECT_EQ(std::memcmp(piped[r].data(), piped[0].data(), sh.count * 4), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(serial[r].data(), serial[0].data(), sh.count * 4), 0) << "rank " << r;
  }
  // With two ranks a sum does not depend on its order: the schedules must agree bit for bit.
  if (N == 2) {
    EXPECT_EQ(piped[0], serial[0]);
  }
  expectClose(piped[0], serial[0], 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Boundaries, PipelineVsSerial,
    ::testing::Values(
        std::make_tuple(2, 4, Shape{{}, 4096}),                  // batched, square 64 x 64
        std::make_tuple(3, 4, Shape{{}, 4099}),                  // batched, padded square
        std::make_tuple(3, 2, Shape{{}, 2 * 3001}),              // batched 2 x 3001: padded
        std::make_tuple(4, 3, Shape{{{37, 53}, {11}, {5, 7, 9}, {1, 900}, {900, 1}, {3, 400}}, 37 * 53 + 11 + 315 + 900 + 900 + 1200}),
        std::make_tuple(2, 8, Shape{{{300, 41}, {2, 2}, {41, 300}}, 300 * 41 * 2 + 4}),  // k > min(n, m) for 2 x 2
        std::make_tuple(3, 1, Shape{{{1001, 13}, {13, 1001}, {7}}, 1001 * 13 * 2 + 7}),
        std::make_tuple(3, 4, Shape{{{5, 1500}, {9}, {40, 1100}}, 5 * 1500 + 9 + 40 * 1100})));  // several column blocks per tensor

TEST(Pipeline, ManyBuffersInterleavedKeepTheirOwnState) {
  ChunkEnv env("300");
  const int N = 3, B = 4;
  const size_t count = 2500;
  // Interleaved calls on B buffers must give each buffer what it gets alone.
  std::vector<std::vector<float>> alone(B), mixed(B);
  for (int pass = 0; pass < 2; ++pass)
    withComms(N, [&](int r, lowrankComm_t comm) {
      std::vector<std::vector<float>> g(B), out(B, std::vector<float>(count));
      for (int b = 0; b < B; ++b) g[b] = gaussian(count, 10 * b + r);
      if (pass == 0) {
        for (int b = 0; b < B; ++b)
          for (int c = 0; c < 3; ++c)
            ASSERT_EQ(lowrankAllReduce(g[b].data(), out[b].data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
      } else {
        for (int c = 0; c < 3; ++c)
          for (int b = B - 1; b >= 0; --b)
            ASSERT_EQ(lowrankAllReduce(g[b].data(), out[b].data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
      }
      if (r == 0) (pass == 0 ? alone : mixed) = out;
    });
  for (int b = 0; b < B; ++b) EXPECT_EQ(alone[b], mixed[b]) << "buffer " << b;
}

TEST(Pipeline, ConcurrentCommunicatorsFromDifferentThreads) {
  ChunkEnv env("400");
  const int N = 2, C = 3;
  const size_t count = 3000;
  std::vector<std::vector<float>> ref(C), got(C);
  // Alone, one communicator after another; then C communicators at once, each on its threads.
  for (int c = 0; c < C; ++c)
    withComms(N, [&](int r, lowrankComm_t comm) {
      std::vector<float> g = gaussian(count, 7 * c + r), out(count);
      for (int i = 0; i < 3; ++i)
        ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
      if (r == 0) ref[c] = out;
    });
  std::vector<std::thread> groups;
  for (int c = 0; c < C; ++c)
    groups.emplace_back([&, c] {
      withComms(N, [&](int r, lowrankComm_t comm) {
        std::vector<float> g = gaussian(count, 7 * c + r), out(count);
        for (int i = 0; i < 3; ++i)
          ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
        if (r == 0) got[c] = out;
      });
    });
  for (auto& t : groups) t.join();
  for (int c = 0; c < C; ++c) EXPECT_EQ(got[c], ref[c]) << "communicator " << c;
}

TEST(Pipeline, NonFiniteInputFallsBackOnEveryRank) {
  ChunkEnv env("500");
  const int N = 3;
  const size_t count = 5000;
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> g = gaussian(count, r), out(count);
    if (r == 2) g[4999] = NAN;  // in the last row block: its count rides in the last P chunk
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    EXPECT_TRUE(std::isnan(out[4999]));
    EXPECT_TRUE(std::isfinite(out[0]));
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.fallbackCalls, 1u);
    g[4999] = 0;
    ASSERT_EQ(lowrankAllReduce(g.data(), out.data(), count, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
  });
}

}  // namespace
