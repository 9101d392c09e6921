// The emulated device's dependency graph, for tests that ask which operation waits on which
// (issue 26: the caller's stream must wait on lowrank's communication only at the final join).
// While a trace is on, every operation queued on a stream is recorded with its direct
// dependencies: the operation before it on its stream, the event record it waits for, and the
// implicit ordering of the legacy default stream with blocking streams, whether or not those have
// already run (the order CUDA guarantees, not the order the emulation happened to take).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct CUstream_st;

namespace emu {

struct TracedOp {
  uint64_t seq = 0;                 // issue order over all streams
  const CUstream_st* stream = nullptr;
  std::string what;                 // "cudaStreamWaitEvent", "kernel launch", "ncclAllReduce", ...
  std::vector<uint64_t> deps;       // seqs of the operations that must run before it
  uint64_t streamDep = 0;           // of those, the one before it on its stream (0: none)
  uint64_t eventDep = 0;            // of those, the event record it waits for (0: none)
};

// Starts recording (clears what an earlier trace recorded).
void traceBegin();
// Stops recording and returns the operations queued since traceBegin, in issue order.
std::vector<TracedOp> traceEnd();

}  // namespace emu
