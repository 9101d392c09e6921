#include "harness_process.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace perf {

bool launchedAsProcesses() {
  for (const char* name :
       {"LOWRANK_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v) > 1;
  }
  return false;
}

namespace {

class ProcessHarness final : public Harness {
 public:
  explicit ProcessHarness(lowrankComm_t control) : ctl_(control) {
    lowrankCommUserRank(ctl_, &rank_);
    lowrankCommCount(ctl_, &n_);
  }
  ~ProcessHarness() override { lowrankCommDestroy(ctl_); }

  int rank() const override { return rank_; }
  int nranks() const override { return n_; }
  bool localRoot() const override { return true; }  // each process measures and writes its JSON
  const char* kind() const override { return "processes"; }

  void barrier() override {
    uint8_t x = 0;
    check(lowrankAllReduce(&x, &x, 1, lowrankUint8, lowrankSum, ctl_, nullptr), ctl_, "barrier");
  }
  double maxDouble(double v) override { return reduce(v, lowrankFloat64, lowrankMax); }
  double sumDouble(double v) override { return reduce(v, lowrankFloat64, lowrankSum); }
  uint64_t sumU64(uint64_t v) override { return reduce(v, lowrankUint64, lowrankSum); }
  uint64_t maxU64(uint64_t v) override { return reduce(v, lowrankUint64, lowrankMax); }
  uint64_t minU64(uint64_t v) override { return reduce(v, lowrankUint64, lowrankMin); }

  lowrankResult_t commInit(lowrankConfig_t* cfg, lowrankComm_t* comm) override {
    // Comm rank 0 makes the id; a max-allreduce of its bytes (zeros elsewhere) hands it to all.
    lowrankUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(lowrankGetUniqueId(&id), nullptr, "lowrankGetUniqueId");
    check(lowrankAllReduce(&id, &id, sizeof id, lowrankUint8, lowrankMax, ctl_, nullptr), ctl_,
          "unique id broadcast");
    return lowrankCommInitRankConfig(comm, n_, id, rank_, cfg);
  }

  [[noreturn]] void fail(const std::string& msg) override { exitWithError(rank_, msg); }

 private:
  template <typename T>
  T reduce(T v, lowrankDataType_t t, lowrankRedOp_t op) {
    check(lowrankAllReduce(&v, &v, 1, t, op, ctl_, nullptr), ctl_, "reduction");
    return v;
  }

  lowrankComm_t ctl_;
  int rank_ = 0, n_ = 1;
};

}  // namespace

int runProcess(const RankMain& body) {
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 0;
  lowrankComm_t control = nullptr;
  const lowrankResult_t r = lowrankCommInitFromEnvConfig(&control, &cfg);
  if (r != lowrankSuccess) {
    std::fprintf(stderr, "lowrank_allreduce_perf: lowrankCommInitFromEnv failed: %s (%s)\n",
                 lowrankGetErrorString(r), lowrankGetLastError(nullptr));
    return 1;
  }
  ProcessHarness h(control);
  return body(h);
}

}  // namespace perf
