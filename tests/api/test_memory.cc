// lowrankBufferGetMemory on host buffers: the bytes of docs/cuda.md's formula ("Memory": residual,
// factors, payload; no workspace, tables or pinned memory on the host), their sum what
// lowrankStats_t.stateBytes counts; a buffer holding no state reports 0; and lowrankCommSetAllocator,
// whose memory host buffers never take, leaves host calls as they were.
#include <gtest/gtest.h>

#include <vector>

#include "support/memory_formula.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

const std::vector<std::vector<size_t>> kShapes = {{96, 40}, {300}, {64, 3, 3, 5}};

lowrankResult_t neverAlloc(void**, size_t, void*, void*) {
  ADD_FAILURE() << "a host buffer took the device allocator's memory";
  return lowrankSystemError;
}
void neverFree(void*, void*, void*) { ADD_FAILURE() << "a host buffer freed device memory"; }

void reportsTheFormula(bool alternate) {
  withComms(2, [alternate](int rank, lowrankComm_t comm) {
    size_t count = 0;
    std::vector<int> ndims;
    std::vector<const size_t*> dims;
    for (const auto& s : kShapes) {
      size_t n = 1;
      for (size_t d : s) n *= d;
      count += n;
      ndims.push_back(int(s.size()));
      dims.push_back(s.data());
    }
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = float((i * 31 + size_t(rank)) % 17) - 8.f;
    lowrankMemoryInfo_t m = LOWRANK_MEMORY_INFO_INITIALIZER;
    ASSERT_EQ(lowrankBufferGetMemory(comm, buf.data(), &m), lowrankSuccess);
    EXPECT_EQ(m.planned, 0) << "never called";
    EXPECT_EQ(m.totalBytes, 0u);
    ASSERT_EQ(lowrankCommSetAllocator(comm, &neverAlloc, &neverFree, nullptr), lowrankSuccess);
    ASSERT_EQ(lowrankBufferSetLayout(comm, buf.data(), int(kShapes.size()), ndims.data(),
                                     dims.data()), lowrankSuccess);
    ASSERT_EQ(lowrankBufferSetAlternate(comm, buf.data(), alternate ? 1 : 0), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(buf.data(), buf.data(), count, lowrankFloat32, lowrankAvg, comm,
                               nullptr), lowrankSuccess) << lowrankGetLastError(comm);
    ASSERT_EQ(lowrankBufferGetMemory(comm, buf.data(), &m), lowrankSuccess);
    EXPECT_EQ(m.supplied, 0);
    expectMemoryFormula(m, memoryFormula(kShapes, 4, false, alternate));
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.stateBytes, m.totalBytes);
    EXPECT_EQ(lowrankBufferGetMemory(comm, buf.data(), nullptr), lowrankInvalidArgument);
    ASSERT_EQ(lowrankBufferRelease(comm, buf.data()), lowrankSuccess);
    ASSERT_EQ(lowrankBufferGetMemory(comm, buf.data(), &m), lowrankSuccess);
    EXPECT_EQ(m.totalBytes, 0u) << "released";
  });
}

TEST(Memory, HostBufferReportsTheFormula) { reportsTheFormula(false); }

// Alternating: the Q wire carries the exact part and the checks, and the last Q step's own Q is
// kept for the next P step's residual.
TEST(Memory, HostAlternatingBufferReportsTheFormula) { reportsTheFormula(true); }

}  // namespace
