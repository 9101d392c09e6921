#include "harness.h"

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

namespace perf {

void Harness::check(lowrankResult_t r, lowrankComm_t comm, const char* what) {
  if (r == lowrankSuccess) return;
  std::string msg = std::string(what) + " failed: " + lowrankGetErrorString(r);
  const char* last = lowrankGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  fail(msg);
}

void exitWithError(int rank, const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "lowrank_allreduce_perf: comm rank %d: %s\n", rank, msg.c_str());
  std::fflush(stderr);
  _exit(1);  // other ranks may wait in a collective (threads) or notice us leave (processes)
}

namespace {

// State shared by the threads of one run.
struct Shared {
  explicit Shared(int n) : nranks(n), sync(n), d(n), u(n) {}
  int nranks;
  std::barrier<> sync;
  std::vector<double> d;
  std::vector<uint64_t> u;
  std::vector<lowrankUniqueId> ids;
};

class ThreadHarness final : public Harness {
 public:
  ThreadHarness(Shared* s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int nranks() const override { return s_->nranks; }
  void barrier() override { s_->sync.arrive_and_wait(); }

  double maxDouble(double v) override {
    return reduce(s_->d, v, [](double a, double b) { return std::max(a, b); });
  }
  double sumDouble(double v) override {
    return reduce(s_->d, v, [](double a, double b) { return a + b; });
  }
  uint64_t sumU64(uint64_t v) override {
    return reduce(s_->u, v, [](uint64_t a, uint64_t b) { return a + b; });
  }
  uint64_t maxU64(uint64_t v) override {
    return reduce(s_->u, v, [](uint64_t a, uint64_t b) { return std::max(a, b); });
  }
  uint64_t minU64(uint64_t v) override {
    return reduce(s_->u, v, [](uint64_t a, uint64_t b) { return std::min(a, b); });
  }

  lowrankResult_t commInit(lowrankConfig_t* cfg, lowrankComm_t* comm) override {
    lowrankUniqueId id;
    if (next_ < s_->ids.size()) {
      id = s_->ids[next_];
    } else {  // more communicators than planned: rank 0 makes the id, the others copy it
      barrier();
      if (rank_ == 0) {
        lowrankUniqueId fresh;
        check(lowrankGetUniqueId(&fresh), nullptr, "lowrankGetUniqueId");
        s_->ids.push_back(fresh);
      }
      barrier();
      id = s_->ids[next_];
      barrier();
    }
    ++next_;
    return lowrankCommInitRankConfig(comm, s_->nranks, id, rank_, cfg);
  }

  [[noreturn]] void fail(const std::string& msg) override { exitWithError(rank_, msg); }

 private:
  // Every rank writes its value to its slot, then reduces all slots in rank order.
  template <typename T, typename F>
  T reduce(std::vector<T>& slots, T v, F f) {
    slots[rank_] = v;
    barrier();
    T r = slots[0];
    for (int i = 1; i < s_->nranks; ++i) r = f(r, slots[i]);
    barrier();  // nobody overwrites a slot before all have read it
    return r;
  }

  Shared* s_;
  int rank_;
  size_t next_ = 0;
};

}  // namespace

int runThreads(int nthreads, int ncomms, const RankMain& body) {
  Shared shared(nthreads);
  for (int c = 0; c < ncomms; ++c) {
    lowrankUniqueId id;
    const lowrankResult_t r = lowrankGetUniqueId(&id);
    if (r != lowrankSuccess) {
      std::fprintf(stderr, "lowrank_allreduce_perf: lowrankGetUniqueId failed: %s (%s)\n",
                   lowrankGetErrorString(r), lowrankGetLastError(nullptr));
      return 1;
    }
    shared.ids.push_back(id);
  }
  std::vector<int> status(nthreads, 0);
  std::vector<std::thread> threads;
  threads.reserve(nthreads);
  for (int r = 0; r < nthreads; ++r) {
    threads.emplace_back([&, r] {
      ThreadHarness h(&shared, r);
      status[r] = body(h);
    });
  }
  for (auto& t : threads) t.join();
  return *std::max_element(status.begin(), status.end());
}

}  // namespace perf
