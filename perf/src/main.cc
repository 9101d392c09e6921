// lowrank_allreduce_perf: nccl-tests' all_reduce_perf for lowrank's compressed allreduce.
// Flags in args.cc, rank launch in harness.cc, the measurements in bench.cc; see docs/perf.md.
#include "args.h"
#include "bench.h"
#include "harness.h"
#include "harness_process.h"

#include <cstdio>

int main(int argc, char** argv) {
  const perf::Args args = perf::parseArgs(argc, argv);
  const perf::RankMain body = [&](perf::Harness& h) { return perf::runRank(h, args); };
  if (perf::launchedAsProcesses()) {  // one comm rank per process, from the launcher's variables
    if (args.nthreads != 1) {
      std::fprintf(stderr, "lowrank_allreduce_perf: started by a launcher (world size > 1): use -t 1\n");
      return 2;
    }
    return perf::runProcess(body);
  }
  return perf::runThreads(args.nthreads, perf::commsNeeded(args), body);
}
