// Failures of the UCX transport: timeouts, abort from another thread, peers that leave.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <thread>

#include "tests/transport/support.h"
#include "transport/bootstrap/bootstrap.h"
#include "util/log.h"

namespace lowrank::test {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

UcxTransportOptions withTls(const char* tls, bool ring) {
  UcxTransportOptions o;
  o.tls = tls;
  if (ring) o.algorithm = ucx::Algorithm::Ring;
  return o;
}

TEST(Failure, TimeoutWhenAPeerNeverCalls) {
  auto g = makeGroup(2, 1.0);
  ASSERT_EQ(g.size(), 2u);
  std::vector<float> x(100, 1.0f);
  auto t0 = Clock::now();
  Status st = g[0]->allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);
  double took = since(t0);
  EXPECT_EQ(st.code, lowrankTimeout) << st.msg;
  EXPECT_NE(st.msg.find("comm rank 1"), std::string::npos) << st.msg;
  EXPECT_NE(st.msg.find("#1"), std::string::npos) << st.msg;  // the collective's sequence number
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 4.0);
  // A failed transport stays failed.
  st = g[0]->allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);
  EXPECT_EQ(st.code, lowrankInvalidUsage) << st.msg;
  t0 = Clock::now();
  g.clear();  // destroying both, one of them failed, must not hang
  EXPECT_LT(since(t0), 5.0);
}

TEST(Failure, AbortFromAnotherThreadUnblocksAWaitingAllreduce) {
  for (bool ring : {false, true}) {
    auto g = makeGroup(3, 60, ring ? withTls("", true) : UcxTransportOptions{});
    ASSERT_EQ(g.size(), 3u);
    std::vector<float> x(ring ? 100000 : 10, 1.0f);
    Status st;
    double took = 0;
    std::thread waiter([&] {
      auto t0 = Clock::now();
      st = g[0]->allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);  // peers never call
      took = since(t0);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto t1 = Clock::now();
    g[0]->abort();
    waiter.join();
    EXPECT_LT(since(t1), 2.0) << "abort did not unblock promptly";
    EXPECT_GE(took, 0.25);
    EXPECT_EQ(st.code, lowrankRemoteError) << st.msg;
    EXPECT_NE(st.msg.find("abort"), std::string::npos) << st.msg;
    st = g[0]->allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);
    EXPECT_EQ(st.code, lowrankInvalidUsage) << st.msg;
    auto t0 = Clock::now();
    g.clear();
    EXPECT_LT(since(t0), 5.0);
  }
}

TEST(Failure, DestroyedTransportDoesNotHangItsPeers) {
  for (const char* tls : {"", "tcp,self"}) {
    auto g = makeGroup(3, 2.0, withTls(tls, true));
    ASSERT_EQ(g.size(), 3u);
    auto t0 = Clock::now();
    g[2].reset();  // leaves while its peers still exist
    EXPECT_LT(since(t0), 3.0) << "destroy hung (UCX_TLS=" << tls << ")";
    std::vector<std::vector<float>> x(2, std::vector<float>(50000, 1.0f));
    std::vector<Status> sts(2);
    t0 = Clock::now();
    runRanks(2, [&](int r) {
      sts[size_t(r)] = g[size_t(r)]->allreduce(x[size_t(r)].data(), x[size_t(r)].size(), lowrankFloat32, lowrankSum);
    });
    EXPECT_LT(since(t0), 6.0);
    for (auto& st : sts) {
      EXPECT_TRUE(st.code == lowrankRemoteError || st.code == lowrankTimeout) << st.code << " " << st.msg;
      if (logLevel() >= LogLevel::Info) std::printf("UCX_TLS=%s: %s\n", tls, st.msg.c_str());
    }
    t0 = Clock::now();
    g.clear();
    EXPECT_LT(since(t0), 5.0);
  }
}

TEST(Failure, PeerLeavingDuringAWaitIsARemoteErrorOverTcp) {
  auto g = makeGroup(2, 20, withTls("tcp,self", false));
  ASSERT_EQ(g.size(), 2u);
  std::vector<float> x(64, 1.0f);
  Status st;
  double took = 0;
  std::thread waiter([&] {
    auto t0 = Clock::now();
    st = g[0]->allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);
    took = since(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  g[1].reset();
  waiter.join();
  EXPECT_EQ(st.code, lowrankRemoteError) << st.msg;
  EXPECT_LT(took, 10.0);
  // the peer and what happened in the user's words; UCX's words (e.g. "Endpoint timeout") after
  EXPECT_NE(st.msg.find("comm rank 1 disconnected"), std::string::npos) << st.msg;
  EXPECT_NE(st.msg.find("; UCX: "), std::string::npos) << st.msg;
}

// Each rank destroys its transport as soon as its last call returns, while slower peers may still be
// finishing theirs: what a finished rank sent must still arrive.
TEST(Failure, RanksLeavingRightAfterTheirLastCallDoNotHurtSlowerPeers) {
  for (const char* tls : {"", "tcp,self"}) {
    for (bool ring : {false, true}) {
      const int n = 4;
      auto g = makeGroup(n, 10, withTls(tls, ring));
      ASSERT_EQ(g.size(), size_t(n));
      std::vector<Status> sts(n);
      std::vector<std::vector<float>> x(n, std::vector<float>(ring ? 30000 : 100));
      runRanks(n, [&](int r) {
        for (int i = 0; i < 5 && sts[size_t(r)].ok(); ++i) {
          std::fill(x[size_t(r)].begin(), x[size_t(r)].end(), float(r + i));
          if (r == 0 && i == 4) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          sts[size_t(r)] = g[size_t(r)]->allreduce(x[size_t(r)].data(), x[size_t(r)].size(), lowrankFloat32, lowrankSum);
        }
        g[size_t(r)].reset();
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(sts[size_t(r)].ok()) << "UCX_TLS=" << tls << " comm rank " << r << ": " << sts[size_t(r)].msg;
        EXPECT_EQ(x[size_t(r)].front(), float(6 + 4 * 4));
        EXPECT_EQ(x[size_t(r)].back(), float(6 + 4 * 4));
      }
    }
  }
}

TEST(Failure, CreationTimesOutWhenARankNeverJoins) {
  lowrankUniqueId id;
  ASSERT_TRUE(bootstrap::makeUniqueId(&id, 1.0).ok());
  std::vector<std::unique_ptr<Transport>> t(2);
  std::vector<Status> sts(2);
  auto t0 = Clock::now();
  runRanks(2, [&](int r) { sts[size_t(r)] = createUcxTransport(id, r, 3, 1.0, &t[size_t(r)]); });
  EXPECT_LT(since(t0), 5.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sts[size_t(r)].code, lowrankTimeout) << sts[size_t(r)].msg;
    EXPECT_EQ(t[size_t(r)], nullptr);
  }
}

}  // namespace
}  // namespace lowrank::test
