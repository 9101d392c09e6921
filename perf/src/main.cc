// lowrank_allreduce_perf: nccl-tests' all_reduce_perf for lowrank's compressed allreduce.
// Flags in args.cc, rank launch in harness.cc, the measurements in bench.cc; see docs/perf.md.
#include "args.h"
#include "bench.h"
#include "harness.h"

int main(int argc, char** argv) {
  const perf::Args args = perf::parseArgs(argc, argv);
  return perf::runThreads(args.nthreads, perf::commsNeeded(args),
                          [&](perf::Harness& h) { return perf::runRank(h, args); });
}
