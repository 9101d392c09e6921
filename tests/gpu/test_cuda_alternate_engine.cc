// Alternating PowerSGD (ACP-SGD; docs/design.md, "Alternating factors") on device buffers, through
// the C API on one comm rank (two comm ranks: two_rank_worker.cc, alternate): the device engine
// gives the host engine's outputs call after call (P and Q steps, per tensor and batched,
// pipelined in small chunks, dtypes, with and without error feedback), keeps the invariant of
// error feedback at every call (out + E = G + E_before, read through the checkpoint), recovers
// from a rejected P or Q step, and holds Plan::stateBytes (the Q wire is a Q step's payload).
// Skips without a device; on the CPU emulation in CI.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "gpu/device_support.h"
#include "support/memory_formula.h"
#include "support/ranks.h"
#include "support/env.h"

using namespace lowrank::testing;

namespace {

// Two compressed tensors and a bias (per tensor), or one batched matrix.
const std::vector<std::vector<size_t>> kShapes = {{96, 200}, {300}, {128, 3, 3, 17}};

lowrankConfig_t alternating(int k, bool ef = true) {
  lowrankConfig_t c = config(k);
  c.alternate = 1;
  c.errorFeedback = ef;
  c.seed = 13;
  return c;
}

// (dtype, per tensor, pipelined, k, error feedback)
using Case = std::tuple<lowrankDataType_t, bool, bool, int, bool>;
class DeviceEngineAlternate : public ::testing::TestWithParam<Case> {};

// Six calls (P, Q, P, Q, P, Q) of the device engine against the host engine on the same inputs:
// every output within 1e-4 relative (float32; 1e-2 in 16-bit dtypes) of the host's; the device
// plan is pipelined in several chunks where asked (both engines read LOWRANK_PIPELINE_CHUNK), and
// each call sends one factor (payloadElements: P then Q).
TEST_P(DeviceEngineAlternate, AgreesWithTheHostEngineCallAfterCall) {
  LR_SKIP_WITHOUT_DEVICE();
  const auto [dtype, perTensor, pipelined, k, ef] = GetParam();
  const size_t count = countOf(kShapes);
  EnvGuard chunk("LOWRANK_PIPELINE_CHUNK", "2048");
  lowrankConfig_t cfg = alternating(k, ef);
  cfg.pipeline = pipelined;
  const int calls = 6;
  std::vector<std::vector<float>> inputs, hostOut(calls);
  for (int c = 0; c < calls; ++c) inputs.push_back(decayingInput(1, count, 0, 200 + c));
  uint64_t hostPayload = 0;
  withComms(1, [&](int, lowrankComm_t comm) {
    std::vector<char> raw(count * dtypeBytes(dtype)), out(raw.size());
    if (perTensor) setLayoutOf(comm, out.data(), kShapes);
    for (int c = 0; c < calls; ++c) {
      lowrank::host::fromFloat32(inputs[c].data(), count, 1.f, raw.data(), dtype);
      ASSERT_EQ(lowrankAllReduce(raw.data(), out.data(), count, dtype, lowrankAvg, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      hostOut[c].resize(count);
      lowrank::host::toFloat32(out.data(), dtype, count, hostOut[c].data());
    }
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    hostPayload = st.payloadElements;
  }, cfg);

  OneRankNccl one(cfg);
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, count * dtypeBytes(dtype)), cudaSuccess);
  if (perTensor) setLayoutOf(one.comm, out, kShapes);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const double tol = dtype == lowrankFloat32 ? 1e-4 : 1e-2;
  for (int c = 0; c < calls; ++c) {
    void* g = toDevice(inputs[c], dtype);
    ASSERT_EQ(lowrankAllReduce(g, out, count, dtype, lowrankAvg, one.comm, s), lowrankSuccess)
        << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<float> dev = fromDevice(out, count, dtype);
    for (float v : dev) ASSERT_TRUE(std::isfinite(v)) << "call " << c;
    EXPECT_LT(relErr(dev, hostOut[c]), tol) << "call " << c << (c % 2 ? " (Q step)" : " (P step)");
    cudaFree(g);
  }
  expectDeviceEngineRan(one.comm, out, calls);
  lowrankBufferView_t view;
  ASSERT_EQ(lowrankBufferGetView(one.comm, out, &view), lowrankSuccess);
  EXPECT_EQ(view.perTensor, int(perTensor));
  if (pipelined) {
    EXPECT_GT(view.chunks, 1u) << "several chunks per phase";
  }
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.payloadElements, hostPayload) << "one factor per call, as the host's";
  EXPECT_EQ(st.fallbackCalls, 0u);
  cudaStreamDestroy(s);
  cudaFree(out);
}

std::string caseName(const ::testing::TestParamInfo<Case>& i) {
  const lowrankDataType_t dtype = std::get<0>(i.param);
  return std::string(dtype == lowrankFloat32 ? "f32" : dtype == lowrankFloat16 ? "f16" : "bf16") +
         (std::get<1>(i.param) ? "_perTensor" : "_batched") +
         (std::get<2>(i.param) ? "_pipelined" : "") + "_k" + std::to_string(std::get<3>(i.param)) +
         (std::get<4>(i.param) ? "_ef" : "_noef");
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, DeviceEngineAlternate,
    ::testing::Values(Case{lowrankFloat32, true, true, 4, true}, Case{lowrankFloat32, false, true, 4, true},
                      Case{lowrankFloat32, true, false, 2, true}, Case{lowrankFloat32, false, false, 1, true},
                      Case{lowrankFloat32, true, true, 2, false}, Case{lowrankFloat32, false, true, 40, true},
                      Case{lowrankBfloat16, true, true, 4, true}, Case{lowrankFloat16, false, true, 8, true}),
    caseName);

// The residual of buf's tensors, read through the checkpoint (by position: kShapes' order).
std::vector<float> residualOf(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  std::vector<unsigned char> b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  lowrank::SavedTensors saved;
  const lowrank::Status st = lowrank::decode(b.data(), b.size(), &saved);
  EXPECT_TRUE(st.ok()) << st.msg;
  std::vector<float> e;
  for (const lowrank::SavedTensor& t : saved.tensors) e.insert(e.end(), t.residual.begin(), t.residual.end());
  return e;
}

// One comm rank, avg: out + E_after = G + E_before at every call, to float rounding, P and Q
// steps alike (the residual is of the rank's own factor, taken before the allreduce). A
// non-finite input at a P step and at a Q step: that call's output is NaN and it is counted; the
// residual is dropped (as PowerSGD's device path), and the calls after it are finite and keep the
// invariant (after a rejected P step the Q step runs against the first k unit vectors).
TEST(DeviceEngineAlternate, ErrorFeedbackInvariantAndRejectedSteps) {
  LR_SKIP_WITHOUT_DEVICE();
  const size_t count = countOf(kShapes);
  const size_t compressedEnd = 96 * 200;  // the first tensor's elements (the bias is exact)
  OneRankNccl one(alternating(3));
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, count * 4), cudaSuccess);
  setLayoutOf(one.comm, out, kShapes);
  std::vector<float> eBefore(count, 0.f);
  int rejected = 0;
  for (int c = 0; c < 10; ++c) {
    std::vector<float> x = decayingInput(1, count, 0, 300 + c);
    const bool bad = c == 4 || c == 7;  // a P step, then a Q step
    if (bad) x[17] = NAN;
    void* g = toDevice(x, lowrankFloat32);
    ASSERT_EQ(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> o = fromDevice(out, count, lowrankFloat32);
    const std::vector<float> e = residualOf(one.comm, out);
    ASSERT_EQ(e.size(), count);
    if (bad) {
      ++rejected;
      for (size_t i = 0; i < compressedEnd; ++i) ASSERT_TRUE(std::isnan(o[i])) << "call " << c;
      for (size_t i = 0; i < compressedEnd; ++i) ASSERT_EQ(e[i], 0.f) << "call " << c;
    } else {
      double d = 0, n = 0;
      for (size_t i = 0; i < compressedEnd; ++i) {
        ASSERT_TRUE(std::isfinite(o[i])) << "call " << c;
        const double want = double(x[i]) + eBefore[i];
        d += (o[i] + double(e[i]) - want) * (o[i] + double(e[i]) - want);
        n += want * want;
      }
      EXPECT_LT(std::sqrt(d / n), 1e-5) << "call " << c << ": out + E != G + E_before";
    }
    eBefore = e;
    cudaFree(g);
  }
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.fallbackCalls, uint64_t(rejected));
  EXPECT_EQ(st.compressedCalls, 10u);
  cudaFree(out);
}

// The device state of an alternating plan is Plan::stateBytes: the Q wire holds a Q step's
// payload (exact part | Q | checks), so factorBytes = 4 (m k + exactElems + m k + 2).
TEST(DeviceEngineAlternate, StateBytesAreThePlansWithTheQStepPayload) {
  LR_SKIP_WITHOUT_DEVICE();
  // Within memory_formula.h's bounds (the one-block orthonormalization, no partial sums).
  const std::vector<std::vector<size_t>> shapes = {{96, 40}, {300}, {64, 3, 3, 5}};
  const int k = 4;
  lowrankConfig_t cfg = alternating(k);
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  const size_t count = countOf(shapes);
  void* g = toDevice(decayingInput(1, count, 0, 5), lowrankFloat32);
  setLayoutOf(one.comm, g, shapes);
  for (int c = 0; c < 2; ++c)
    ASSERT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  lowrankMemoryInfo_t m = LOWRANK_MEMORY_INFO_INITIALIZER;
  ASSERT_EQ(lowrankBufferGetMemory(one.comm, g, &m), lowrankSuccess);
  expectMemoryFormula(m, memoryFormula(shapes, k, true, /*alternate=*/true));
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.stateBytes, m.residualBytes + m.factorBytes + m.payloadBytes);
  // The host engine's state of the same plan holds the same bytes (Plan::stateBytes) and the last
  // Q step's own Q (4 m k: HostState::ownQ, its residual left to the next P step).
  size_t mk = 0;
  for (const auto& s : shapes)
    if (s.size() >= 2) mk += countOf({s}) / s[0] * size_t(k);
  withComms(1, [&](int, lowrankComm_t comm) {
    std::vector<float> buf(count, 0.5f);
    setLayoutOf(comm, buf.data(), shapes);
    for (int c = 0; c < 2; ++c)
      ASSERT_EQ(lowrankAllReduce(buf.data(), buf.data(), count, lowrankFloat32, lowrankAvg, comm,
                                 nullptr), lowrankSuccess);
    lowrankStats_t hs;
    ASSERT_EQ(lowrankGetStats(comm, &hs), lowrankSuccess);
    EXPECT_EQ(hs.stateBytes, st.stateBytes + 4 * mk);
  }, cfg);
  cudaFree(g);
}

}  // namespace
