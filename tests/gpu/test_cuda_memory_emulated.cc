// lowrank's own device allocation failing (emulation only: the emulated runtime runs out of device
// memory on demand, alloc_failures.h): the buffer is planned exact-only, counted in
// lowrankStats_t.exactOnlyPlans, its call an exact allreduce; what the half-made state took is
// freed; once memory is back and the buffer reset, it is compressed, and the memory reported is
// docs/cuda.md's formula with lowrank's own allocation (supplied 0).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "emu/alloc_failures.h"
#include "gpu/device_support.h"
#include "support/memory_formula.h"

using namespace lowrank::testing;

namespace {

const std::vector<std::vector<size_t>> kShapes = {{96, 40}, {300}, {64, 3, 3, 5}};

TEST(DeviceMemoryEmulated, OwnAllocationFailingMakesTheBufferExactOnlyAndCountsIt) {
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 4;
  cfg.startIter = 0;
  OneRankNccl one(cfg);
  const size_t count = countOf(kShapes);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = float(i % 13) - 6.f;
  {  // the communicator's own device side is made at its first device call: before the failures
    void* warm = toDevice(x, lowrankFloat32);
    ASSERT_EQ(lowrankAllReduce(warm, warm, count, lowrankFloat32, lowrankMax, one.comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(warm);
  }
  for (long after : {0L, 3L}) {  // the first of the state's allocations, then a later one
    void* g = toDevice(x, lowrankFloat32);
    setLayoutOf(one.comm, g, kShapes);
    lowrankStats_t before;
    ASSERT_EQ(lowrankGetStats(one.comm, &before), lowrankSuccess);
    emu::failDeviceAllocations(after);
    const lowrankResult_t r =
        lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, nullptr);
    emu::failDeviceAllocations(-1);
    ASSERT_EQ(r, lowrankSuccess) << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
    EXPECT_EQ(st.exactOnlyPlans, before.exactOnlyPlans + 1) << "after " << after;
    EXPECT_EQ(st.compressedCalls, before.compressedCalls);
    EXPECT_EQ(fromDevice(g, count, lowrankFloat32), x) << "one rank's exact mean is its input";
    lowrankMemoryInfo_t m = LOWRANK_MEMORY_INFO_INITIALIZER;
    ASSERT_EQ(lowrankBufferGetMemory(one.comm, g, &m), lowrankSuccess);
    EXPECT_EQ(m.planned, 0) << "an exact-only buffer holds no state";
    EXPECT_EQ(m.totalBytes, 0u);

    // Memory back: reset, and the next call is compressed with lowrank's own memory.
    ASSERT_EQ(lowrankBufferReset(one.comm, g), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, one.comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(one.comm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(lowrankGetStats(one.comm, &st), lowrankSuccess);
    EXPECT_EQ(st.compressedCalls, before.compressedCalls + 1);
    ASSERT_EQ(lowrankBufferGetMemory(one.comm, g, &m), lowrankSuccess);
    EXPECT_EQ(m.supplied, 0);
    expectMemoryFormula(m, memoryFormula(kShapes, 4, true));
    ASSERT_EQ(lowrankBufferRelease(one.comm, g), lowrankSuccess);
    cudaFree(g);
  }
}

}  // namespace
