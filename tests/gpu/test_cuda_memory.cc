// Device memory from the application (lowrankCommSetAllocator) and the bytes a buffer holds
// (lowrankBufferGetMemory), through the C API on one comm rank: a counting allocator serves every
// byte of a device buffer's state, for the order of the call's stream, and gets every byte back;
// the reported bytes are docs/cuda.md's formula ("Memory") and what the allocator gave; an
// allocator that refuses fails the call with a clear error, gives back what the half-made state
// took, and loses nothing (the tensors' state is as before, the communicator usable, the next call
// goes on). On the CPU emulation in CI (tests/gpu/emu), on a GPU by run_device_checks.sh.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "gpu/device_support.h"
#include "support/memory_formula.h"

using namespace lowrank::testing;

namespace {

// Counts what it gives and gets back; refuses the allocation numbered failAt (0-based) and every
// one after it while `failing`.
struct Counting {
  size_t live = 0, allocs = 0, frees = 0;
  long failAt = -1;
  std::set<void*> streams;  // the streams alloc was given
  std::vector<std::pair<void*, size_t>> held;

  static lowrankResult_t alloc(void** p, size_t bytes, void* stream, void* user) {
    auto* c = static_cast<Counting*>(user);
    if (c->failAt >= 0 && long(c->allocs) >= c->failAt) return lowrankSystemError;
    if (cudaMallocAsync(p, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess)
      return lowrankSystemError;
    ++c->allocs;
    c->live += bytes;
    c->streams.insert(stream);
    c->held.emplace_back(*p, bytes);
    return lowrankSuccess;
  }
  static void free(void* p, void* stream, void* user) {
    auto* c = static_cast<Counting*>(user);
    for (auto it = c->held.begin(); it != c->held.end(); ++it)
      if (it->first == p) {
        c->live -= it->second;
        c->held.erase(it);
        ++c->frees;
        cudaFreeAsync(p, static_cast<cudaStream_t>(stream));
        return;
      }
    ADD_FAILURE() << "free of " << p << ", which the allocator did not give";
  }
};

// Within memory_formula.h's bounds (the one-block orthonormalization, no partial sums).
const std::vector<std::vector<size_t>> kShapes = {{96, 40}, {300}, {64, 3, 3, 5}};
constexpr int kRank = 4;

lowrankMemoryInfo_t memoryOf(lowrankComm_t comm, const void* buf) {
  lowrankMemoryInfo_t info = LOWRANK_MEMORY_INFO_INITIALIZER;
  EXPECT_EQ(lowrankBufferGetMemory(comm, buf, &info), lowrankSuccess) << lowrankGetLastError(comm);
  return info;
}

lowrankConfig_t config() {
  lowrankConfig_t c = LOWRANK_CONFIG_INITIALIZER;
  c.approxRank = kRank;
  c.startIter = 0;
  return c;
}

std::vector<float> input(size_t count, int call) {
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = float((i * 7919 + 31 * call) % 101) / 50.f - 1.f;
  return x;
}

// The tensors of kShapes with ids, in the given order of kShapes' indices.
std::vector<lowrankTensor_t> tensors(const std::vector<int>& order) {
  std::vector<lowrankTensor_t> out;
  for (int i : order) {
    lowrankTensor_t t{};
    t.id = 100 + uint64_t(i);
    t.ndims = int(kShapes[i].size());
    for (size_t d = 0; d < kShapes[i].size(); ++d) t.shape[d] = kShapes[i][d];
    t.approxRank = LOWRANK_RANK_DEFAULT;
    out.push_back(t);
  }
  return out;
}

std::vector<unsigned char> saved(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  std::vector<unsigned char> out(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, out.data(), &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  return out;
}

TEST(DeviceMemory, SuppliedAllocatorServesEveryByteAndTheReportIsTheFormula) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config());
  Counting a;
  ASSERT_EQ(lowrankCommSetAllocator(one.comm, &Counting::alloc, &Counting::free, &a),
            lowrankSuccess);
  const size_t count = countOf(kShapes);
  void* g = toDevice(input(count, 0), lowrankFloat32);
  setLayoutOf(one.comm, g, kShapes);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(memoryOf(one.comm, g).planned, 0) << "not planned yet";
  for (int call = 0; call < 2; ++call)
    ASSERT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, s),
              lowrankSuccess) << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  expectDeviceEngineRan(one.comm, g, 2);

  const lowrankMemoryInfo_t m = memoryOf(one.comm, g);
  EXPECT_EQ(m.supplied, 1);
  expectMemoryFormula(m, memoryFormula(kShapes, kRank, true));
  EXPECT_GT(m.tableBytes, 0u);
  EXPECT_EQ(a.live, m.totalBytes - m.pinnedBytes) << "every device byte is the allocator's";
  EXPECT_EQ(a.streams, std::set<void*>{s}) << "given the planning call's stream";
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.stateBytes, m.residualBytes + m.factorBytes + m.payloadBytes);

  // A future header's larger struct: filled as far as this library's; a too small one refused.
  struct Larger {
    lowrankMemoryInfo_t info;
    uint64_t later;
  } larger{};
  larger.info.size = sizeof larger;
  larger.later = 77;
  ASSERT_EQ(lowrankBufferGetMemory(one.comm, g, &larger.info), lowrankSuccess);
  EXPECT_EQ(larger.info.totalBytes, m.totalBytes);
  EXPECT_EQ(larger.later, 77u) << "a field this library does not know is left as it was";
  lowrankMemoryInfo_t small = LOWRANK_MEMORY_INFO_INITIALIZER;
  small.size = 16;
  EXPECT_EQ(lowrankBufferGetMemory(one.comm, g, &small), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommSetAllocator(one.comm, &Counting::alloc, nullptr, &a),
            lowrankInvalidArgument);

  ASSERT_EQ(lowrankBufferRelease(one.comm, g), lowrankSuccess);
  EXPECT_EQ(a.live, 0u) << "every byte given back at the release";
  EXPECT_EQ(a.frees, a.allocs);
  EXPECT_EQ(memoryOf(one.comm, g).totalBytes, 0u);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  cudaFree(g);
}

// The allocator refuses the new grouping's state, at each of its first allocations in turn: the
// call fails with the allocator's error, what was taken comes back, and the ids' state stays
// where it was (saved bytes equal), so the next call, with memory, takes it.
TEST(DeviceMemory, RefusedAllocationFailsTheCallAndLosesNothing) {
  LR_SKIP_WITHOUT_DEVICE();
  OneRankNccl one(config());
  Counting a;
  ASSERT_EQ(lowrankCommSetAllocator(one.comm, &Counting::alloc, &Counting::free, &a),
            lowrankSuccess);
  const size_t count = countOf(kShapes);
  void* g1 = toDevice(input(count, 0), lowrankFloat32);
  const std::vector<lowrankTensor_t> first = tensors({0, 1, 2});
  ASSERT_EQ(lowrankBufferSetTensors(one.comm, g1, 3, first.data()), lowrankSuccess);
  for (int call = 0; call < 2; ++call)
    ASSERT_EQ(lowrankAllReduce(g1, g1, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<unsigned char> before = saved(one.comm, g1);
  const size_t held = a.live;

  // Another grouping of the same ids: a new state, its ids' state copied in.
  void* g2 = toDevice(input(count, 1), lowrankFloat32);
  const std::vector<lowrankTensor_t> regrouped = tensors({2, 0, 1});
  ASSERT_EQ(lowrankBufferSetTensors(one.comm, g2, 3, regrouped.data()), lowrankSuccess);
  lowrankStats_t st0;
  ASSERT_EQ(lowrankGetStats(one.comm, &st0), lowrankSuccess);
  for (long failAt : {0L, 1L, 5L}) {
    a.failAt = long(a.allocs) + failAt;
    EXPECT_EQ(lowrankAllReduce(g2, g2, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
              lowrankSystemError) << "allocation " << failAt;
    const std::string why = lowrankGetLastError(one.comm);
    EXPECT_NE(why.find("supplied allocator (lowrankCommSetAllocator)"), std::string::npos) << why;
    EXPECT_NE(why.find("changed nothing"), std::string::npos) << why;
    EXPECT_EQ(a.live, held) << "what the refused state took was given back (allocation "
                            << failAt << ")";
    EXPECT_EQ(saved(one.comm, g1), before) << "the ids' state is as it was";
  }
  lowrankStats_t st;
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.exactOnlyPlans, 0u) << "a refusal is an error, not an exact-only buffer";
  EXPECT_EQ(st.calls, st0.calls) << "the refused calls did not count";

  // Memory again: the same call goes on from the ids' state (the communicator is usable).
  a.failAt = -1;
  ASSERT_EQ(lowrankAllReduce(g2, g2, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
            lowrankSuccess) << lowrankGetLastError(one.comm);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
  EXPECT_EQ(st.compressedCalls, 3u);
  lowrankBufferView_t view;
  ASSERT_EQ(lowrankBufferGetView(one.comm, g2, &view), lowrankSuccess);
  EXPECT_EQ(view.planned, 1);
  ASSERT_EQ(lowrankBufferRelease(one.comm, g2), lowrankSuccess);
  ASSERT_EQ(lowrankBufferRelease(one.comm, g1), lowrankSuccess);
  EXPECT_EQ(a.live, 0u);
  cudaFree(g1);
  cudaFree(g2);
}

}  // namespace
