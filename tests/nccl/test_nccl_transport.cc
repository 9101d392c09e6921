// NcclTransport (plugin/transport/nccl) over the NCCL test double, resolved as lowrank resolves
// the real library (nccl::realNccl: libnccl.so.2 from LD_LIBRARY_PATH). The double's own
// entry points (init, destroy, call counts) are looked up in the same handle, so this binary
// links neither the double nor liblowrank.so: only lowrank's internals, statically.
#include <gtest/gtest.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "transport/nccl/nccl_transport.h"
#include "util/convert.h"

namespace lowrank {
namespace {

struct UniqueId { char internal[128]; };  // ncclUniqueId
struct Double {
  int (*getUniqueId)(UniqueId*);
  int (*commInitRank)(void**, int, UniqueId, int);
  int (*commDestroy)(void*);
  unsigned long long (*callCount)(const char*);
  void (*failCollective)(void*, unsigned long long, int);
};

const nccl::Api& api() {
  const nccl::Api* a = nullptr;
  Status s = nccl::realNccl(&a);
  EXPECT_TRUE(s.ok()) << s.msg;
  return *a;
}

const Double& dbl() {
  static Double d = [] {
    void* h = api().handle;
    Double x;
    x.getUniqueId = reinterpret_cast<int (*)(UniqueId*)>(dlsym(h, "ncclGetUniqueId"));
    x.commInitRank = reinterpret_cast<int (*)(void**, int, UniqueId, int)>(dlsym(h, "ncclCommInitRank"));
    x.commDestroy = reinterpret_cast<int (*)(void*)>(dlsym(h, "ncclCommDestroy"));
    x.callCount = reinterpret_cast<unsigned long long (*)(const char*)>(dlsym(h, "ncclDoubleCallCount"));
    x.failCollective =
        reinterpret_cast<void (*)(void*, unsigned long long, int)>(dlsym(h, "ncclDoubleFailCollective"));
    return x;
  }();
  return d;
}

// Runs body(rank, transport) (or body(rank, transport, ncclComm)) on n threads, each over its own
// NCCL communicator of the double.
template <typename F>
void withTransports(int n, F body) {
  ASSERT_NE(dbl().callCount, nullptr) << "libnccl.so.2 is not the test double: " << api().path;
  UniqueId id;
  ASSERT_EQ(dbl().getUniqueId(&id), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      void* comm = nullptr;
      ASSERT_EQ(dbl().commInitRank(&comm, n, id, r), 0);
      std::unique_ptr<NcclTransport> t;
      Status s = NcclTransport::create(&api(), comm, 30, &t);
      ASSERT_TRUE(s.ok()) << s.msg;
      if constexpr (std::is_invocable_v<F, int, NcclTransport&, void*>)
        body(r, *t, comm);
      else
        body(r, *t);
      t.reset();  // the NCCL comm is not the transport's: it is still there to destroy
      EXPECT_EQ(dbl().commDestroy(comm), 0);
    });
  for (auto& t : threads) t.join();
}

TEST(NcclTransport, RankAndSizeFromTheComm) {
  withTransports(3, [](int rank, NcclTransport& t) {
    EXPECT_EQ(t.rank(), rank);
    EXPECT_EQ(t.size(), 3);
  });
  std::unique_ptr<NcclTransport> t;
  EXPECT_EQ(NcclTransport::create(&api(), nullptr, 30, &t).code, lowrankInvalidArgument);
}

TEST(NcclTransport, AllreducesInPlaceAndCountsTheRing) {
  const int n = 3;
  withTransports(n, [&](int rank, NcclTransport& t) {
    std::vector<double> x(301);
    for (size_t i = 0; i < x.size(); ++i) x[i] = double(i) * (rank + 1);
    ASSERT_TRUE(t.allreduce(x.data(), x.size(), lowrankFloat64, lowrankAvg).ok());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], double(i) * 6 / 3);
    // 301 = 3 x 100 + 1: 2 (N-1) blocks of 100 elements, and 2 (N-1)/N of the remainder (rounded down)
    EXPECT_EQ(t.counters().elementsSent.load(), 100u * 4 + 4 / 3);
    EXPECT_EQ(t.counters().bytesSent.load(), 8u * (100 * 4 + 4 / 3));
    EXPECT_EQ(t.counters().messages.load(), 4u);
  });
}

// 16-bit factors (transport/wire.h) over NCCL: the part goes as its own ncclAllReduce of bfloat16,
// summed by NCCL in that type, the rest as float32; every rank the same bits, the part a bf16
// value within one rounding per rank of the sum, the rest exact, the bytes 2 per element of it.
TEST(NcclTransport, SixteenBitPartGoesAsItsOwnAllreduce) {
  const int n = 3;
  const size_t count = 300, lo = 100, hi = 250;
  std::vector<std::vector<float>> out(n);
  withTransports(n, [&](int rank, NcclTransport& t) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = i >= lo && i < hi ? 1.f / float(i + rank + 3) : float(i) * (rank + 1);
    ASSERT_TRUE(t.allreduce(x.data(), count, lowrankFloat32, lowrankSum, Wire{lowrankBfloat16, lo, hi}).ok());
    for (size_t i = 0; i < count; ++i) {
      if (i >= lo && i < hi) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += 1.0 / double(i + r + 3);
        EXPECT_EQ(x[i], host::toFloat(host::toBf16(x[i]))) << i;
        EXPECT_NEAR(x[i], sum, n * sum / 256) << i;
      } else {
        EXPECT_EQ(x[i], float(i) * 6) << i;
      }
    }
    const uint64_t N = n;
    auto ring = [N](uint64_t c) { return (c / N) * 2 * (N - 1) + (c % N) * 2 * (N - 1) / N; };
    EXPECT_EQ(t.counters().bytesSent.load(), 4 * ring(lo) + 2 * ring(hi - lo) + 4 * ring(count - hi));
    out[size_t(rank)] = x;
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(out[size_t(r)], out[0]);
}

TEST(NcclTransport, CountZeroMakesNoNcclCall) {
  ASSERT_NE(dbl().callCount, nullptr);
  const unsigned long long before = dbl().callCount("pncclAllReduce");
  withTransports(2, [&](int, NcclTransport& t) {
    EXPECT_TRUE(t.allreduce(nullptr, 0, lowrankFloat32, lowrankSum).ok());
    EXPECT_EQ(t.counters().messages.load(), 0u);
    float x = 1;
    ASSERT_TRUE(t.allreduce(&x, 1, lowrankFloat32, lowrankSum).ok());
    EXPECT_EQ(x, 2.f);
  });
  EXPECT_EQ(dbl().callCount("pncclAllReduce"), before + 2);  // one real call per comm rank
  EXPECT_EQ(dbl().callCount("ncclAllReduce"), 0u);           // never the interposable name
}

TEST(NcclTransport, AbortRefusesLaterCallsAndBadInputIsRefused) {
  withTransports(1, [&](int, NcclTransport& t) {
    float x = 1;
    EXPECT_EQ(t.allreduce(&x, 1, lowrankNumTypes, lowrankSum).code, lowrankInvalidArgument);
    EXPECT_EQ(t.allreduce(nullptr, 4, lowrankFloat32, lowrankSum).code, lowrankInvalidArgument);
    EXPECT_FALSE(t.broken());  // argument errors do not break it
    EXPECT_TRUE(t.allreduce(&x, 1, lowrankFloat32, lowrankSum).ok());
    t.abort();
    EXPECT_TRUE(t.broken());
    Status s = t.allreduce(&x, 1, lowrankFloat32, lowrankSum);
    EXPECT_EQ(s.code, lowrankInvalidUsage);
    EXPECT_NE(s.msg.find("aborted"), std::string::npos) << s.msg;
  });
}

// Whatever code NCCL returns for the allreduce (ncclInvalidUsage and ncclInvalidArgument
// included), the transport is broken: later calls are refused, naming that first failure, with no
// NCCL call. Both comm ranks arm the same call on their own comm (ncclDoubleFailCollective).
TEST(NcclTransport, AnyNcclErrorOfACollectiveBreaksTheTransport) {
  ASSERT_NE(dbl().failCollective, nullptr);
  for (int code : {5 /* ncclInvalidUsage */, 4 /* ncclInvalidArgument */, 6 /* ncclRemoteError */}) {
    const unsigned long long before = dbl().callCount("pncclAllReduce");
    withTransports(2, [&](int, NcclTransport& t, void* comm) {
      float x[3] = {1, 2, 3};
      ASSERT_TRUE(t.allreduce(x, 3, lowrankFloat32, lowrankSum).ok());
      dbl().failCollective(comm, 1, code);
      Status s = t.allreduce(x, 3, lowrankFloat32, lowrankSum);
      EXPECT_EQ(int(s.code), code) << s.msg;  // NCCL's code, mapped (the same number)
      EXPECT_NE(s.msg.find("ncclAllReduce failed"), std::string::npos) << s.msg;
      EXPECT_TRUE(t.broken()) << "NCCL code " << code;
      EXPECT_NE(t.failure().find("failure injected by ncclDoubleFailCollective"), std::string::npos)
          << t.failure();
      s = t.allreduce(x, 3, lowrankFloat32, lowrankSum);
      EXPECT_EQ(s.code, lowrankInvalidUsage);
      EXPECT_NE(s.msg.find("nccl allreduce: the transport failed earlier: ncclAllReduce failed"),
                std::string::npos) << s.msg;
    });
    EXPECT_EQ(dbl().callCount("pncclAllReduce") - before, 2u * 2u);  // the refused calls made none
  }
}

// An NCCL failure carries NCCL's own text (ncclGetLastError), not only its code's name: here the
// double refuses an allreduce whose counts differ across its ranks.
TEST(NcclTransport, ErrorsCarryNcclsLastErrorText) {
  std::vector<Status> res(2);
  withTransports(2, [&](int r, NcclTransport& t) {
    std::vector<float> x(r == 0 ? 4 : 8, 1.f);
    res[r] = t.allreduce(x.data(), x.size(), lowrankFloat32, lowrankSum);
  });
  int failed = 0;
  for (const Status& s : res) {
    if (s.ok()) continue;
    ++failed;
    EXPECT_NE(s.msg.find("(NCCL error "), std::string::npos) << s.msg;
    EXPECT_NE(s.msg.find("): ncclAllReduce"), std::string::npos) << "NCCL's text missing: " << s.msg;
  }
  EXPECT_GE(failed, 1);
}

// A nonblocking communicator (the double's NCCL_DOUBLE_INPROGRESS=N: every collective returns
// ncclInProgress, and the next N polls of ncclCommGetAsyncError still say so): nccl::settle, the
// one wait every NCCL call of lowrank goes through, waits it out and gives the call's result.
class InProgress : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("NCCL_DOUBLE_INPROGRESS"); }
};

TEST_F(InProgress, IsWaitedOutThenTheCallSucceeds) {
  setenv("NCCL_DOUBLE_INPROGRESS", "3", 1);
  withTransports(2, [](int rank, NcclTransport& t, void* comm) {
    std::vector<float> x(64, float(rank + 1));
    const nccl::Result r = api().allReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankSum, comm, nullptr);
    ASSERT_EQ(r, nccl::kInProgress) << "the double's communicator is nonblocking";
    const Status s = nccl::settle(api(), comm, r, 30, "ncclAllReduce");
    EXPECT_TRUE(s.ok()) << s.msg;
    int async = -1;
    ASSERT_EQ(api().commGetAsyncError(comm, &async), nccl::kSuccess);
    EXPECT_EQ(async, nccl::kSuccess) << "settle returned before the call was done";
    for (float v : x) ASSERT_EQ(v, 3.f);
    // The transport's calls (ncclAllReduce through settle, then its wait for the stream).
    std::vector<double> y(301, double(rank + 1));
    const Status u = t.allreduce(y.data(), y.size(), lowrankFloat64, lowrankSum);
    ASSERT_TRUE(u.ok()) << u.msg;
    for (double v : y) ASSERT_EQ(v, 3.0);
  });
}

TEST_F(InProgress, PastTheTimeoutIsLowrankTimeoutNamingTheCall) {
  setenv("NCCL_DOUBLE_INPROGRESS", "1000000000000", 1);  // never done
  withTransports(1, [](int, NcclTransport&, void* comm) {
    float x = 1.f;
    const nccl::Result r = api().allReduce(&x, &x, 1, lowrankFloat32, lowrankSum, comm, nullptr);
    ASSERT_EQ(r, nccl::kInProgress);
    const auto start = std::chrono::steady_clock::now();
    const Status s = nccl::settle(api(), comm, r, 0.3, "ncclAllReduce (plan check)");
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(s.code, lowrankTimeout) << s.msg;
    EXPECT_NE(s.msg.find("ncclAllReduce (plan check)"), std::string::npos) << s.msg;
    EXPECT_NE(s.msg.find("ncclInProgress"), std::string::npos) << s.msg;
    EXPECT_GE(waited, 0.3);
    EXPECT_LT(waited, 5.0) << "bounded by the timeout, not hanging";
  });
}

}  // namespace
}  // namespace lowrank
