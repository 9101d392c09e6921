// One comm rank of a perf run: makes the communicators, the inputs and the reference, times the
// allreduce out-of-place and in-place, measures ratio / relerr / cumrelerr / relerr_opt / #wrong,
// and (comm rank 0) prints the table and writes the JSON.
#pragma once

#include "args.h"
#include "harness.h"

namespace perf {

// Communicators each comm rank makes (harness ids to prepare): the exact one, and the PowerSGD one.
int commsNeeded(const Args& args);

// The body of one comm rank; returns the process exit status (comm rank 0's matters).
int runRank(Harness& h, const Args& args);

}  // namespace perf
