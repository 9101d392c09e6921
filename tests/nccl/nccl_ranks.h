// Test support: N comm ranks as threads of this process, each with its own NCCL communicator of
// the test double (one comm rank per thread, as the double requires).
#pragma once
#include <gtest/gtest.h>
#include <nccl.h>

#include <functional>
#include <thread>
#include <vector>

namespace ncclranks {

// Runs body(rank, comm) on n threads; every thread initializes and destroys its own NCCL comm.
inline void withNcclComms(int n, const std::function<void(int, ncclComm_t)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      ASSERT_EQ(ncclCommInitRank(&comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      body(r, comm);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess) << ncclGetLastError(comm);
    });
  for (auto& t : threads) t.join();
}

}  // namespace ncclranks
