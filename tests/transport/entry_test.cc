// Transport's one entry (transport.h), over a fake transport whose collective (run) does what the
// test says: arguments checked once for every transport without breaking it, any error of run()
// breaking it with the first failure kept, a broken transport refusing later calls, abort; and
// AsyncTransport sharing its inner transport's failure record.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "transport/async_transport.h"
#include "transport/transport.h"

namespace lowrank::test {
namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

class FakeTransport final : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* name() const override { return "fake"; }

  Status next;               // what run() returns
  bool throwBadAlloc = false, throwOther = false;
  bool blockUntilAbort = false;  // run() waits for onAbort(), then fails as a transport would
  std::atomic<int> runs{0}, aborts{0};
  std::atomic<bool> running{false};
  size_t lastCount = ~size_t(0);

 protected:
  Status run(void*, size_t count, lowrankDataType_t, lowrankRedOp_t, const Wire&) override {
    ++runs;
    lastCount = count;
    if (throwBadAlloc) throw std::bad_alloc();
    if (throwOther) throw std::runtime_error("fake exception");
    if (blockUntilAbort) {
      running = true;
      while (aborts.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return Status::Error(lowrankRemoteError, "fake: aborted while waiting");
    }
    return next;
  }
  void onAbort() override { ++aborts; }
};

TEST(TransportEntry, ArgumentErrorsAreRefusedBeforeRunAndDoNotBreak) {
  FakeTransport t;
  float x[4] = {};
  Status s = t.allreduce(x, 4, lowrankNumTypes, lowrankSum);
  EXPECT_EQ(s.code, lowrankInvalidArgument);
  EXPECT_TRUE(contains(s.msg, "fake allreduce: invalid dtype")) << s.msg;
  EXPECT_EQ(t.allreduce(x, 4, lowrankDataType_t(-1), lowrankSum).code, lowrankInvalidArgument);
  EXPECT_EQ(t.allreduce(x, 4, lowrankFloat32, lowrankNumOps).code, lowrankInvalidArgument);
  EXPECT_EQ(t.allreduce(x, 4, lowrankFloat32, lowrankRedOp_t(-1)).code, lowrankInvalidArgument);
  s = t.allreduce(nullptr, 4, lowrankFloat32, lowrankSum);
  EXPECT_EQ(s.code, lowrankInvalidArgument);
  EXPECT_TRUE(contains(s.msg, "null buffer")) << s.msg;
  s = t.allreduce(x, SIZE_MAX / 2, lowrankFloat32, lowrankSum);  // count * 4 overflows
  EXPECT_EQ(s.code, lowrankInvalidArgument);
  EXPECT_TRUE(contains(s.msg, "overflows")) << s.msg;
  EXPECT_EQ(t.runs.load(), 0) << "run() reached with bad arguments";
  EXPECT_FALSE(t.broken());
  EXPECT_EQ(t.failure(), "");
  // Still usable; count 0 with no buffer is a call (ranks keep their sequence), not an error.
  EXPECT_TRUE(t.allreduce(nullptr, 0, lowrankFloat32, lowrankSum).ok());
  EXPECT_EQ(t.lastCount, 0u);
  EXPECT_TRUE(t.allreduce(x, 4, lowrankFloat32, lowrankAvg).ok());
  EXPECT_EQ(t.runs.load(), 2);
  EXPECT_FALSE(t.broken());
}

TEST(TransportEntry, AFailedRunBreaksKeepsTheFirstFailureAndRefusesLaterCalls) {
  FakeTransport t;
  float x[4] = {};
  t.next = Status::Error(lowrankRemoteError, "fake: comm rank 1 lost");
  Status s = t.allreduce(x, 4, lowrankFloat32, lowrankSum);
  EXPECT_EQ(s.code, lowrankRemoteError);
  EXPECT_EQ(s.msg, "fake: comm rank 1 lost");  // run()'s own status, unchanged
  EXPECT_TRUE(t.broken());
  EXPECT_EQ(t.failure(), "fake: comm rank 1 lost");
  // Refused without running, naming the first failure, whatever run() would do now.
  t.next = Status::Ok();
  for (int i = 0; i < 2; ++i) {
    s = t.allreduce(x, 4, lowrankFloat32, lowrankSum);
    EXPECT_EQ(s.code, lowrankInvalidUsage);
    EXPECT_TRUE(contains(s.msg, "fake allreduce: the transport failed earlier: fake: comm rank 1 lost")) << s.msg;
  }
  EXPECT_EQ(t.runs.load(), 1);
  // Arguments are still checked first (their error is the caller's, whatever the state).
  EXPECT_EQ(t.allreduce(nullptr, 4, lowrankFloat32, lowrankSum).code, lowrankInvalidArgument);
  // A later abort does not replace the first failure, and the transport stays broken.
  t.abort();
  EXPECT_EQ(t.aborts.load(), 1);
  EXPECT_TRUE(t.broken());
  EXPECT_EQ(t.failure(), "fake: comm rank 1 lost");
}

// Every error of run() breaks, usage and argument codes included (e.g. NCCL's ncclInvalidUsage or
// ncclInvalidArgument for a collective other ranks may have entered).
TEST(TransportEntry, EveryErrorOfRunBreaks) {
  for (lowrankResult_t code : {lowrankUnhandledCudaError, lowrankSystemError, lowrankInternalError,
                               lowrankInvalidArgument, lowrankInvalidUsage, lowrankRemoteError,
                               lowrankTimeout}) {
    FakeTransport t;
    float x = 1;
    t.next = Status::Error(code, "fake: error %d", int(code));
    EXPECT_EQ(t.allreduce(&x, 1, lowrankFloat32, lowrankSum).code, code);
    EXPECT_TRUE(t.broken()) << "code " << code;
    EXPECT_EQ(t.allreduce(&x, 1, lowrankFloat32, lowrankSum).code, lowrankInvalidUsage);
  }
}

TEST(TransportEntry, AnExceptionOutOfRunBreaks) {
  FakeTransport a, b;
  float x = 1;
  a.throwBadAlloc = true;
  Status s = a.allreduce(&x, 1, lowrankFloat32, lowrankSum);
  EXPECT_EQ(s.code, lowrankSystemError);
  EXPECT_TRUE(contains(s.msg, "out of memory")) << s.msg;
  EXPECT_TRUE(a.broken());
  b.throwOther = true;
  s = b.allreduce(&x, 1, lowrankFloat32, lowrankSum);
  EXPECT_EQ(s.code, lowrankInternalError);
  EXPECT_TRUE(contains(s.msg, "fake exception")) << s.msg;
  EXPECT_TRUE(b.broken());
}

TEST(TransportEntry, AbortBreaksAndWakesAWaitingCall) {
  FakeTransport t;
  float x = 1;
  t.blockUntilAbort = true;
  Status s;
  std::thread waiter([&] { s = t.allreduce(&x, 1, lowrankFloat32, lowrankSum); });
  while (!t.running.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(t.broken());
  t.abort();
  waiter.join();
  EXPECT_EQ(s.code, lowrankRemoteError);
  EXPECT_TRUE(t.broken());
  EXPECT_EQ(t.failure(), "fake: the transport was aborted");  // the abort came first
  s = t.allreduce(&x, 1, lowrankFloat32, lowrankSum);
  EXPECT_EQ(s.code, lowrankInvalidUsage);
  EXPECT_TRUE(contains(s.msg, "aborted")) << s.msg;
  EXPECT_EQ(t.runs.load(), 1);
}

// A failure found by a collective and an abort from other threads at once: one message is kept,
// the same through the inner transport and the asynchronous one.
TEST(TransportEntry, ConcurrentFailuresKeepOneMessage) {
  for (int round = 0; round < 50; ++round) {
    auto* inner = new FakeTransport;
    AsyncTransport t{std::unique_ptr<Transport>(inner)};
    inner->next = Status::Error(lowrankSystemError, "fake: run failed");
    std::atomic<bool> go{false};
    float x = 1;
    std::thread a([&] {
      while (!go.load()) {}
      inner->allreduce(&x, 1, lowrankFloat32, lowrankSum);
    });
    std::vector<std::thread> b;
    for (int i = 0; i < 3; ++i)
      b.emplace_back([&] {
        while (!go.load()) {}
        t.abort();
      });
    go = true;
    a.join();
    for (auto& th : b) th.join();
    ASSERT_TRUE(t.broken());
    const std::string why = t.failure();
    EXPECT_TRUE(why == "fake: run failed" || why == "fake: the transport was aborted") << why;
    EXPECT_EQ(inner->failure(), why);
    EXPECT_EQ(t.failure(), why);
  }
}

// AsyncTransport and its inner transport share one failure record: a failure either finds is
// both's.
TEST(TransportEntry, AsyncSharesTheInnersFailureRecord) {
  {  // a posted job fails in the inner transport
    auto* inner = new FakeTransport;
    AsyncTransport t{std::unique_ptr<Transport>(inner)};
    EXPECT_STREQ(t.name(), "fake");
    float x[8] = {};
    EXPECT_TRUE(t.wait(t.post(x, 8, lowrankFloat32, lowrankSum)).ok());
    EXPECT_FALSE(t.broken());
    inner->next = Status::Error(lowrankTimeout, "fake: timed out");
    Status s = t.wait(t.post(x, 8, lowrankFloat32, lowrankSum));
    EXPECT_EQ(s.code, lowrankTimeout);
    EXPECT_TRUE(inner->broken());
    EXPECT_TRUE(t.broken());
    EXPECT_EQ(t.failure(), "fake: timed out");
    inner->next = Status::Ok();
    s = t.allreduce(x, 8, lowrankFloat32, lowrankSum);
    EXPECT_EQ(s.code, lowrankInvalidUsage);
    EXPECT_TRUE(contains(s.msg, "failed earlier: fake: timed out")) << s.msg;
    // Jobs posted afterwards are refused by the inner transport's entry.
    s = t.wait(t.post(x, 8, lowrankFloat32, lowrankSum));
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(inner->runs.load(), 2);
  }
  {  // an inline call fails
    auto* inner = new FakeTransport;
    AsyncTransport t{std::unique_ptr<Transport>(inner)};
    float x = 1;
    inner->next = Status::Error(lowrankInvalidUsage, "fake: counts differ");
    EXPECT_EQ(t.allreduce(&x, 1, lowrankFloat32, lowrankSum).code, lowrankInvalidUsage);
    EXPECT_TRUE(t.broken());
    EXPECT_TRUE(inner->broken());
    EXPECT_EQ(inner->failure(), "fake: counts differ");
    Status s = inner->allreduce(&x, 1, lowrankFloat32, lowrankSum);  // the inner refuses as well
    EXPECT_TRUE(contains(s.msg, "failed earlier: fake: counts differ")) << s.msg;
  }
  {  // abort on the async transport reaches the inner one (wakes it) once
    auto* inner = new FakeTransport;
    AsyncTransport t{std::unique_ptr<Transport>(inner)};
    t.abort();
    EXPECT_EQ(inner->aborts.load(), 1);
    EXPECT_TRUE(inner->broken());
    EXPECT_TRUE(t.broken());
  }
  {  // argument errors break neither
    auto* inner = new FakeTransport;
    AsyncTransport t{std::unique_ptr<Transport>(inner)};
    EXPECT_EQ(t.allreduce(nullptr, 3, lowrankFloat32, lowrankSum).code, lowrankInvalidArgument);
    EXPECT_FALSE(t.broken());
    EXPECT_FALSE(inner->broken());
    EXPECT_EQ(inner->runs.load(), 0);
  }
}

}  // namespace
}  // namespace lowrank::test
