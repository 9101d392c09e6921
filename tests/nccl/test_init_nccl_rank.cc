// lowrankNcclGetUniqueId and lowrankCommInitNcclRank over the NCCL test double, comm ranks as
// threads: the same results as a communicator over an NCCL communicator the application made,
// with compression; the NCCL communicator lowrank made is destroyed (or aborted) with it, and
// after a failed init (ncclDoubleLiveComms tells); argument errors. Public C API only
// (liblowrank.so and the double's libnccl.so.2).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lowrank/lowrank_nccl.h"
#include "nccl_double.h"
#include "scenario.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Runs body(rank) on n threads, one per comm rank, and joins them.
void onRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

class InitNcclRank : public ::testing::TestWithParam<int> {};

// The NCCL communicators alive are counted at each step, so that a lowrank communicator that
// forgot its NCCL communicator (or destroyed the application's) fails the test.
TEST_P(InitNcclRank, SameAsOverTheApplicationsCommAndDestroyFreesIt) {
  const int n = GetParam();
  const int live0 = ncclDoubleLiveComms();
  const unsigned long long destroys0 = ncclDoubleCallCount("pncclCommDestroy");
  ncclUniqueId ownedId, appId;
  ASSERT_EQ(lowrankNcclGetUniqueId(&ownedId), lowrankSuccess) << lowrankGetLastError(nullptr);
  ASSERT_EQ(ncclGetUniqueId(&appId), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<lowrankComm_t> owned(n, nullptr), overApp(n, nullptr);
  std::vector<ncclComm_t> app(n, nullptr);

  onRanks(n, [&](int rank) {
    lowrankConfig_t cfg = ncclscenario::config(1);
    EXPECT_EQ(lowrankCommInitNcclRank(&owned[rank], n, ownedId, rank, &cfg), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    EXPECT_EQ(ncclCommInitRank(&app[rank], n, appId, rank), ncclSuccess) << ncclGetLastError(nullptr);
    if (app[rank]) {
      EXPECT_EQ(lowrankCommInitFromNcclConfig(&overApp[rank], app[rank], &cfg), lowrankSuccess)
          << lowrankGetLastError(nullptr);
    }
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(owned[r] && app[r] && overApp[r]) << "comm rank " << r;
  EXPECT_EQ(ncclDoubleLiveComms(), live0 + 2 * n);

  onRanks(n, [&](int rank) {
    int v = -1;
    EXPECT_EQ(lowrankCommUserRank(owned[rank], &v), lowrankSuccess);
    EXPECT_EQ(v, rank);
    EXPECT_EQ(lowrankCommCount(owned[rank], &v), lowrankSuccess);
    EXPECT_EQ(v, n);
    std::string outOwned, outApp, err;
    ASSERT_EQ(ncclscenario::run(owned[rank], rank, &outOwned, &err), lowrankSuccess) << err;
    ASSERT_EQ(ncclscenario::run(overApp[rank], rank, &outApp, &err), lowrankSuccess) << err;
    EXPECT_EQ(outOwned.size(), outApp.size());
    EXPECT_TRUE(outOwned == outApp) << "comm rank " << rank << ": outputs differ";
    lowrankStats_t so, sa;
    ASSERT_EQ(lowrankGetStats(owned[rank], &so), lowrankSuccess);
    ASSERT_EQ(lowrankGetStats(overApp[rank], &sa), lowrankSuccess);
    EXPECT_GT(so.compressedCalls, 0u);
    EXPECT_EQ(so.compressedCalls, sa.compressedCalls);
    EXPECT_EQ(so.payloadElements, sa.payloadElements);
  });

  // Destroying lowrank's communicators destroys their NCCL communicators, and only those.
  onRanks(n, [&](int rank) { EXPECT_EQ(lowrankCommDestroy(owned[rank]), lowrankSuccess) << lowrankGetLastError(nullptr); });
  EXPECT_EQ(ncclDoubleLiveComms(), live0 + n);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommDestroy") - destroys0, (unsigned long long)n);
  onRanks(n, [&](int rank) {
    int x = rank + 1;  // the application's NCCL communicator is untouched
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, app[rank], nullptr), ncclSuccess)
        << ncclGetLastError(app[rank]);
    EXPECT_EQ(x, n * (n + 1) / 2);
    EXPECT_EQ(lowrankCommDestroy(overApp[rank]), lowrankSuccess);
    EXPECT_EQ(ncclCommDestroy(app[rank]), ncclSuccess);
  });
  EXPECT_EQ(ncclDoubleLiveComms(), live0);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommDestroy") - destroys0, (unsigned long long)n)
      << "lowrankCommDestroy on a communicator over the application's NCCL comm destroyed it";
}

INSTANTIATE_TEST_SUITE_P(CommRanks, InitNcclRank, ::testing::Values(2, 3));

TEST(InitNcclRankOwnership, AbortAbortsTheNcclComm) {
  const int n = 2;
  const int live0 = ncclDoubleLiveComms();
  const unsigned long long aborts0 = ncclDoubleCallCount("pncclCommAbort");
  const unsigned long long destroys0 = ncclDoubleCallCount("pncclCommDestroy");
  ncclUniqueId id;
  ASSERT_EQ(lowrankNcclGetUniqueId(&id), lowrankSuccess) << lowrankGetLastError(nullptr);
  std::vector<lowrankComm_t> comms(n, nullptr);
  onRanks(n, [&](int rank) {
    ASSERT_EQ(lowrankCommInitNcclRank(&comms[rank], n, id, rank, nullptr), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    std::vector<float> g(4096, float(rank + 1));
    EXPECT_EQ(lowrankAllReduce(g.data(), g.data(), g.size(), lowrankFloat32, lowrankSum, comms[rank], nullptr),
              lowrankSuccess) << lowrankGetLastError(comms[rank]);
  });
  for (int r = 0; r < n; ++r) ASSERT_NE(comms[r], nullptr);
  EXPECT_EQ(ncclDoubleLiveComms(), live0 + n);
  onRanks(n, [&](int rank) { EXPECT_EQ(lowrankCommAbort(comms[rank]), lowrankSuccess) << lowrankGetLastError(nullptr); });
  EXPECT_EQ(ncclDoubleLiveComms(), live0);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommAbort") - aborts0, (unsigned long long)n);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommDestroy"), destroys0);
}

TEST(InitNcclRankErrors, BadArgumentsAreRefusedBeforeAnyNcclCall) {
  const int live0 = ncclDoubleLiveComms();
  const unsigned long long inits0 = ncclDoubleCallCount("pncclCommInitRank");
  ncclUniqueId id;
  ASSERT_EQ(lowrankNcclGetUniqueId(&id), lowrankSuccess) << lowrankGetLastError(nullptr);
  EXPECT_EQ(lowrankNcclGetUniqueId(nullptr), lowrankInvalidArgument);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankNcclGetUniqueId: id is NULL"))
      << lowrankGetLastError(nullptr);

  EXPECT_EQ(lowrankCommInitNcclRank(nullptr, 1, id, 0, nullptr), lowrankInvalidArgument);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankCommInitNcclRank: comm is NULL"))
      << lowrankGetLastError(nullptr);
  struct Bad { int nranks, rank; const char* says; };
  for (const Bad& b : {Bad{0, 0, "nranks 0 < 1"}, Bad{-2, 0, "nranks -2 < 1"},
                       Bad{2, 2, "rank 2 is not in [0, 2)"}, Bad{3, -1, "rank -1 is not in [0, 3)"}}) {
    lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
    EXPECT_EQ(lowrankCommInitNcclRank(&comm, b.nranks, id, b.rank, nullptr), lowrankInvalidArgument)
        << b.says;
    EXPECT_EQ(comm, nullptr) << b.says;
    EXPECT_TRUE(contains(lowrankGetLastError(nullptr), std::string("lowrankCommInitNcclRank: ") + b.says))
        << lowrankGetLastError(nullptr);
  }
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = -3;
  lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
  EXPECT_EQ(lowrankCommInitNcclRank(&comm, 1, id, 0, &cfg), lowrankInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankCommInitNcclRank: ")) << lowrankGetLastError(nullptr);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "approxRank")) << lowrankGetLastError(nullptr);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommInitRank"), inits0) << "an NCCL communicator was made";
  EXPECT_EQ(ncclDoubleLiveComms(), live0);
}

// NCCL's init fails: its error, prefixed; nothing made.
TEST(InitNcclRankErrors, NcclInitFailureIsReturned) {
  const int live0 = ncclDoubleLiveComms();
  ncclUniqueId id;
  ASSERT_EQ(lowrankNcclGetUniqueId(&id), lowrankSuccess) << lowrankGetLastError(nullptr);
  ncclDoubleFailNext("pncclCommInitRank", ncclSystemError);
  lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
  EXPECT_EQ(lowrankCommInitNcclRank(&comm, 1, id, 0, nullptr), lowrankSystemError);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankCommInitNcclRank: ncclCommInitRank failed"))
      << lowrankGetLastError(nullptr);
  EXPECT_EQ(ncclDoubleLiveComms(), live0);

  ncclDoubleFailNext("pncclGetUniqueId", ncclSystemError);
  EXPECT_EQ(lowrankNcclGetUniqueId(&id), lowrankSystemError);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankNcclGetUniqueId: ncclGetUniqueId failed"))
      << lowrankGetLastError(nullptr);
}

// NCCL's init succeeds and lowrank's part then fails: the NCCL communicator is destroyed.
TEST(InitNcclRankErrors, NcclCommIsDestroyedWhenLowranksPartFails) {
  const int live0 = ncclDoubleLiveComms();
  const unsigned long long inits0 = ncclDoubleCallCount("pncclCommInitRank");
  const unsigned long long destroys0 = ncclDoubleCallCount("pncclCommDestroy");
  ncclUniqueId id;
  ASSERT_EQ(lowrankNcclGetUniqueId(&id), lowrankSuccess) << lowrankGetLastError(nullptr);
  ncclDoubleFailNext("pncclCommCount", ncclInternalError);  // asked by lowrank's NCCL transport
  lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
  EXPECT_EQ(lowrankCommInitNcclRank(&comm, 1, id, 0, nullptr), lowrankInternalError);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankCommInitNcclRank: ncclCommCount failed"))
      << lowrankGetLastError(nullptr);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommInitRank") - inits0, 1u);
  EXPECT_EQ(ncclDoubleCallCount("pncclCommDestroy") - destroys0, 1u);
  EXPECT_EQ(ncclDoubleLiveComms(), live0);
}

// An error of the NCCL communicator's destroy is lowrankCommDestroy's (the comm is freed anyway).
TEST(InitNcclRankErrors, NcclDestroyFailureIsReturned) {
  ncclUniqueId id;
  ASSERT_EQ(lowrankNcclGetUniqueId(&id), lowrankSuccess) << lowrankGetLastError(nullptr);
  lowrankComm_t comm = nullptr;
  {
#if defined(__SANITIZE_ADDRESS__)
    __lsan::ScopedDisabler leaked;  // the double's communicator below is left alive by design
#endif
    ASSERT_EQ(lowrankCommInitNcclRank(&comm, 1, id, 0, nullptr), lowrankSuccess)
        << lowrankGetLastError(nullptr);
  }
  ncclDoubleFailNext("pncclCommDestroy", ncclInvalidUsage);
  EXPECT_EQ(lowrankCommDestroy(comm), lowrankInvalidUsage);
  EXPECT_TRUE(contains(lowrankGetLastError(nullptr), "lowrankCommDestroy: ncclCommDestroy failed"))
      << lowrankGetLastError(nullptr);
  // (The double's communicator, refused by the injected failure, stays alive: one comm rank, idle.)
}

}  // namespace
