// How the comm ranks of a perf run are started and talk to each other outside the measured calls.
// One Harness per comm rank. Today: ranks are threads of this process (-t). A later backend (ranks
// as processes, lowrankCommInitFromEnv) implements the same interface: barrier and the reductions
// then go through an allreduce of the library, commInit through the environment's bootstrap.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "lowrank/lowrank.h"

namespace perf {

class Harness {
 public:
  virtual ~Harness() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // The comm rank that measures and writes this process's JSON (rank 0 of the process).
  virtual bool localRoot() const { return rank() == 0; }
  // "threads" or "processes", for the table's header.
  virtual const char* kind() const { return "threads"; }
  // Blocks until every comm rank has called it.
  virtual void barrier() = 0;
  // Collective reductions of one value over all comm ranks; every rank gets the result.
  virtual double maxDouble(double v) = 0;
  virtual double sumDouble(double v) = 0;
  virtual uint64_t sumU64(uint64_t v) = 0;
  virtual uint64_t maxU64(uint64_t v) = 0;
  virtual uint64_t minU64(uint64_t v) = 0;
  // Collective: a new communicator over all comm ranks with this config (the same on every rank).
  virtual lowrankResult_t commInit(lowrankConfig_t* cfg, lowrankComm_t* comm) = 0;
  // Ends the whole run with an error message (other ranks may be blocked in a collective).
  [[noreturn]] virtual void fail(const std::string& msg) = 0;

  // fail() with the library's messages unless r is lowrankSuccess.
  void check(lowrankResult_t r, lowrankComm_t comm, const char* what);
};

// Prints "comm rank R: msg" and ends the process at once (what every Harness::fail does).
[[noreturn]] void exitWithError(int rank, const std::string& msg);

using RankMain = std::function<int(Harness&)>;

// Runs body on nthreads comm ranks (threads of this process) and returns the largest exit status.
// The main thread makes the unique ids (ncomms of them, one per commInit call each rank will make)
// before starting the threads.
int runThreads(int nthreads, int ncomms, const RankMain& body);

}  // namespace perf
