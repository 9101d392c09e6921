// Test support: N comm ranks as threads of this process, each with its own communicator.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "lowrank/lowrank.h"
#include "support/env.h"  // no test leaves LOWRANK_* changed

namespace lowrank::testing {

inline lowrankConfig_t config(int k = 4) {
  lowrankConfig_t c = LOWRANK_CONFIG_INITIALIZER;
  c.approxRank = k;
  c.timeoutSec = 30;
  return c;
}

// Runs body(rank, comms) on n threads; every thread initializes one communicator per config
// (comms[c] made with cfgs[c], the same group of n comm ranks each) and destroys them at the end.
inline void withCommSets(int n, const std::vector<lowrankConfig_t>& cfgs,
                         const std::function<void(int, const std::vector<lowrankComm_t>&)>& body) {
  std::vector<lowrankUniqueId> ids(cfgs.size());
  for (auto& id : ids) ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::vector<lowrankComm_t> comms(cfgs.size(), nullptr);
      for (size_t c = 0; c < cfgs.size(); ++c) {
        lowrankConfig_t cf = cfgs[c];
        ASSERT_EQ(lowrankCommInitRankConfig(&comms[c], n, ids[c], r, &cf), lowrankSuccess)
            << lowrankGetLastError(nullptr);
      }
      body(r, comms);
      for (lowrankComm_t comm : comms) EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
    });
  for (auto& t : threads) t.join();
}

// Runs body(rank, comm) on n threads; every thread initializes and destroys its own comm.
inline void withComms(int n, const std::function<void(int, lowrankComm_t)>& body,
                      lowrankConfig_t cfg = config()) {
  withCommSets(n, {cfg}, [&](int r, const std::vector<lowrankComm_t>& comms) { body(r, comms[0]); });
}

}  // namespace lowrank::testing
