// Test support: N comm ranks as threads of this process, each with its own communicator.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "lowrank/lowrank.h"

namespace lowrank::testing {

inline lowrankConfig_t config(int k = 4) {
  lowrankConfig_t c = LOWRANK_CONFIG_INITIALIZER;
  c.approxRank = k;
  c.timeoutSec = 30;
  return c;
}

// Runs body(rank, comm) on n threads; every thread initializes and destroys its own comm.
inline void withComms(int n, const std::function<void(int, lowrankComm_t)>& body,
                      lowrankConfig_t cfg = config()) {
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      lowrankConfig_t c = cfg;
      lowrankComm_t comm = nullptr;
      ASSERT_EQ(lowrankCommInitRankConfig(&comm, n, id, r, &c), lowrankSuccess)
          << lowrankGetLastError(nullptr);
      body(r, comm);
      EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
    });
  for (auto& t : threads) t.join();
}

}  // namespace lowrank::testing
