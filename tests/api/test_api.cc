// Every bad argument of every API function gives its documented error, and a clear message.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>
#include <set>
#include <string>

#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

std::string lastErr(lowrankComm_t c = nullptr) { return lowrankGetLastError(c); }

TEST(Api, VersionAndErrorStrings) {
  int v = 0;
  EXPECT_EQ(lowrankGetVersion(&v), lowrankSuccess);
  EXPECT_EQ(v, LOWRANK_VERSION_CODE);
  EXPECT_EQ(lowrankGetVersion(nullptr), lowrankInvalidArgument);
  EXPECT_NE(lastErr().find("NULL"), std::string::npos);
  std::set<std::string> seen;
  for (int r = 0; r < lowrankNumResults; ++r) {
    const char* s = lowrankGetErrorString(lowrankResult_t(r));
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(seen.insert(s).second) << "duplicate string for " << r;
  }
  EXPECT_STREQ(lowrankGetErrorString(lowrankResult_t(99)), "unknown result code");
}

TEST(Api, CommInitBadArguments) {
  lowrankUniqueId id;
  EXPECT_EQ(lowrankGetUniqueId(nullptr), lowrankInvalidArgument);
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  lowrankComm_t c = reinterpret_cast<lowrankComm_t>(0x1);
  EXPECT_EQ(lowrankCommInitRank(nullptr, 1, id, 0), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommInitRank(&c, 0, id, 0), lowrankInvalidArgument);
  EXPECT_EQ(c, nullptr) << "*comm is null on error";
  EXPECT_EQ(lowrankCommInitRank(&c, 2, id, 2), lowrankInvalidArgument);
  EXPECT_NE(lastErr().find("rank 2"), std::string::npos);
  EXPECT_EQ(lowrankCommInitRank(&c, 2, id, -1), lowrankInvalidArgument);
  lowrankUniqueId zero;
  std::memset(&zero, 0, sizeof zero);
  EXPECT_EQ(lowrankCommInitRank(&c, 1, zero, 0), lowrankInvalidArgument);
  lowrankConfig_t bad = LOWRANK_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_EQ(lowrankCommInitRankConfig(&c, 1, id, 0, &bad), lowrankInvalidArgument);
  EXPECT_NE(lastErr().find("LOWRANK_CONFIG_INITIALIZER"), std::string::npos);
  struct { const char* field; void (*set)(lowrankConfig_t&); } fields[] = {
      {"approxRank", [](lowrankConfig_t& x) { x.approxRank = -1; }},
      {"minCompressionRate", [](lowrankConfig_t& x) { x.minCompressionRate = 0.5; }},
      {"startIter", [](lowrankConfig_t& x) { x.startIter = -3; }},
      {"startIter", [](lowrankConfig_t& x) { x.startIter = (1 << 30) + 1; }},  // lowrank.h's range
      {"errorFeedback", [](lowrankConfig_t& x) { x.errorFeedback = 2; }},
      {"warmStart", [](lowrankConfig_t& x) { x.warmStart = 7; }},
      {"orthoEpsilon", [](lowrankConfig_t& x) { x.orthoEpsilon = -1e-3; }},
      {"seed", [](lowrankConfig_t& x) { x.seed = -5; }},
      {"timeoutSec", [](lowrankConfig_t& x) { x.timeoutSec = 0; }}};
  for (auto& f : fields) {
    lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
    f.set(cfg);
    EXPECT_EQ(lowrankCommInitRankConfig(&c, 1, id, 0, &cfg), lowrankInvalidArgument) << f.field;
    EXPECT_NE(lastErr().find(f.field), std::string::npos) << lastErr();
  }
  // The id is still good after refused attempts.
  ASSERT_EQ(lowrankCommInitRank(&c, 1, id, 0), lowrankSuccess) << lastErr();
  int n = 0, r = -1;
  EXPECT_EQ(lowrankCommCount(c, &n), lowrankSuccess);
  EXPECT_EQ(lowrankCommUserRank(c, &r), lowrankSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(r, 0);
  EXPECT_EQ(lowrankCommCount(c, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommCount(nullptr, &n), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommUserRank(c, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommUserRank(nullptr, &r), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommDestroy(c), lowrankSuccess);
  EXPECT_EQ(lowrankCommDestroy(nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankCommAbort(nullptr), lowrankInvalidArgument);
}

class OneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    lowrankUniqueId id;
    ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
    ASSERT_EQ(lowrankCommInitRank(&comm, 1, id, 0), lowrankSuccess);
  }
  void TearDown() override { EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess); }
  lowrankComm_t comm = nullptr;
};

TEST_F(OneRank, AllReduceBadArguments) {
  alignas(16) float buf[64] = {};
  alignas(16) float out[64] = {};
  auto call = [&](const void* s, void* r, size_t n, int dt, int op, lowrankComm_t c, void* st = nullptr) {
    return lowrankAllReduce(s, r, n, lowrankDataType_t(dt), lowrankRedOp_t(op), c, st);
  };
  EXPECT_EQ(call(buf, out, 64, lowrankFloat32, lowrankSum, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(call(nullptr, out, 64, lowrankFloat32, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("sendbuff"), std::string::npos);
  EXPECT_EQ(call(buf, nullptr, 64, lowrankFloat32, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("recvbuff"), std::string::npos);
  EXPECT_EQ(call(buf, out, 0, lowrankFloat32, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("count"), std::string::npos);
  EXPECT_EQ(call(buf, out, 64, 10, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_EQ(call(buf, out, 64, -1, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("datatype"), std::string::npos);
  EXPECT_EQ(call(buf, out, 64, lowrankFloat32, 5, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("op"), std::string::npos);
  char* raw = reinterpret_cast<char*>(buf);
  EXPECT_EQ(call(raw + 1, out, 8, lowrankFloat32, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("aligned"), std::string::npos);
  EXPECT_EQ(call(buf, reinterpret_cast<char*>(out) + 2, 8, lowrankFloat16, lowrankSum, comm),
            lowrankSuccess);  // 2-byte aligned is enough for float16
  EXPECT_EQ(call(buf, buf + 1, 32, lowrankFloat32, lowrankSum, comm), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("overlap"), std::string::npos);
  EXPECT_EQ(call(buf, out, 64, lowrankFloat32, lowrankSum, comm, reinterpret_cast<void*>(0x10)),
            lowrankInvalidArgument);
  // Bad arguments lose nothing: the communicator still works and the output is right.
  for (int i = 0; i < 64; ++i) buf[i] = float(i);
  EXPECT_EQ(call(buf, out, 64, lowrankFloat32, lowrankSum, comm), lowrankSuccess);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(out[i], float(i), 1e-4);
}

TEST_F(OneRank, BufferFunctionsBadArguments) {
  alignas(16) float buf[100] = {};
  size_t s0[] = {10, 10};
  const size_t* shapes[] = {s0};
  int nd[] = {2};
  EXPECT_EQ(lowrankBufferSetLayout(nullptr, buf, 1, nd, shapes), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferSetLayout(comm, nullptr, 1, nd, shapes), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 0, nd, shapes), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nullptr, shapes), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd, nullptr), lowrankInvalidArgument);
  int nd0[] = {0}, nd9[] = {9};
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd0, shapes), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd9, shapes), lowrankInvalidArgument);
  size_t sz[] = {10, 0};
  const size_t* zshapes[] = {sz};
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd, zshapes), lowrankInvalidArgument);
  size_t huge[] = {(size_t(1) << 62) + 1, 4};  // 2^64 + 4 elements: wraps to 4
  const size_t* hugeShapes[] = {huge};
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd, hugeShapes), lowrankInvalidArgument);
  EXPECT_NE(lastErr(comm).find("overflow"), std::string::npos);
  const size_t* nullShape[] = {nullptr};
  EXPECT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd, nullShape), lowrankInvalidArgument);
  // A layout that does not cover the call's count: invalid usage at the call.
  ASSERT_EQ(lowrankBufferSetLayout(comm, buf, 1, nd, shapes), lowrankSuccess);
  EXPECT_EQ(lowrankAllReduce(buf, buf, 99, lowrankFloat32, lowrankSum, comm, nullptr), lowrankInvalidUsage);
  EXPECT_NE(lastErr(comm).find("layout"), std::string::npos);
  EXPECT_EQ(lowrankAllReduce(buf, buf, 100, lowrankFloat32, lowrankSum, comm, nullptr), lowrankSuccess);

  lowrankBufferView_t v;
  EXPECT_EQ(lowrankBufferGetView(nullptr, buf, &v), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferGetView(comm, nullptr, &v), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferGetView(comm, buf, nullptr), lowrankInvalidArgument);
  float other[4];
  EXPECT_EQ(lowrankBufferGetView(comm, other, &v), lowrankSuccess);
  EXPECT_EQ(v.planned, 0);
  EXPECT_EQ(lowrankBufferReset(nullptr, buf), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferReset(comm, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferReset(comm, other), lowrankSuccess);
  EXPECT_EQ(lowrankBufferRelease(nullptr, buf), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferRelease(comm, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankBufferRelease(comm, buf), lowrankSuccess);
  lowrankStats_t st;
  EXPECT_EQ(lowrankGetStats(nullptr, &st), lowrankInvalidArgument);
  EXPECT_EQ(lowrankGetStats(comm, nullptr), lowrankInvalidArgument);
  EXPECT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
  EXPECT_EQ(st.calls, 1u);
}

TEST(Api, AbortedCommunicatorIsFreedAndAbortUnblocksNothingPending) {
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  lowrankComm_t c;
  ASSERT_EQ(lowrankCommInitRank(&c, 1, id, 0), lowrankSuccess);
  EXPECT_EQ(lowrankCommAbort(c), lowrankSuccess);
}

}  // namespace

namespace {

// A peer that never calls: the waiting rank times out, then its comm refuses further calls.
TEST(Api, TimeoutThenTheCommunicatorRefusesCalls) {
  lowrankConfig_t cfg = config(4);
  cfg.timeoutSec = 1;
  std::atomic<bool> done{false};
  withComms(2, [&](int r, lowrankComm_t comm) {
    if (r == 1) {  // alive, but never calls
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::vector<float> x(4096, 1.f);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankTimeout);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 3.0);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("buffer"), std::string::npos)
        << "the message names the buffer: " << lowrankGetLastError(comm);
    EXPECT_EQ(lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankInvalidUsage);
    done = true;
  }, cfg);
}

// lowrankCommAbort from another thread unblocks a call waiting for a peer that never comes.
TEST(Api, AbortFromAnotherThreadUnblocksACallInProgress) {
  lowrankUniqueId id;
  ASSERT_EQ(lowrankGetUniqueId(&id), lowrankSuccess);
  lowrankComm_t comms[2] = {nullptr, nullptr};
  std::thread init1([&] { ASSERT_EQ(lowrankCommInitRank(&comms[1], 2, id, 1), lowrankSuccess); });
  ASSERT_EQ(lowrankCommInitRank(&comms[0], 2, id, 0), lowrankSuccess);
  init1.join();
  std::atomic<bool> returned{false};
  lowrankResult_t res = lowrankSuccess;
  double waited = 0;
  std::thread caller([&] {
    std::vector<float> x(4096, 1.f);
    const auto t0 = std::chrono::steady_clock::now();
    res = lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, comms[0], nullptr);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(returned) << "the call should be waiting for comm rank 1";
  EXPECT_EQ(lowrankCommAbort(comms[0]), lowrankSuccess);  // waits for the call to leave the comm
  caller.join();
  EXPECT_TRUE(returned);
  EXPECT_EQ(res, lowrankRemoteError);
  EXPECT_LT(waited, 5.0);  // the default timeout is 300 s: only the abort can have ended it
  EXPECT_EQ(lowrankCommDestroy(comms[1]), lowrankSuccess);
}

}  // namespace
