// Command-line flags of lowrank_allreduce_perf (nccl-tests' flags plus lowrank's own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"

namespace perf {

enum class Mode { PowerSgd, Exact, Fp16 };
const char* modeName(Mode m);

struct Args {
  size_t minBytes = 32 << 20;
  size_t maxBytes = 32 << 20;
  size_t stepBytes = 1 << 20;
  double stepFactor = 1.0;  // > 1: multiplicative steps (-f), else additive (-i)
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::vector<lowrankDataType_t> types = {lowrankFloat32};
  std::vector<lowrankRedOp_t> ops = {lowrankSum};
  int nthreads = 1;
  std::string jsonFile;
  int approxRank = 4;
  std::vector<Mode> modes = {Mode::PowerSgd};
  std::string gradientsDir;
  std::string step;  // file prefix; empty: the first <prefix>_worker0.safetensors found
  int rounds = 10;
  uint64_t seed = 0;  // synthetic inputs (not the library's LOWRANK_SEED)
  size_t triadMib = 64;  // MiB per triad array (three arrays); 0: no triad, no bound
  bool phases = true;    // measure compute_us and comm_us (each phase alone) per row
  bool digest = false;   // print each comm rank's FNV-1a 64 of the outputs of each row's calls
  bool ids = false;      // --gradients: declare the tensors with ids 0..n-1 (lowrankBufferSetTensors)
  bool move = false;     // --ids: recvbuff alternates between two allocations, ids declared each call
  std::string commandLine;
};

// Parses argv. On a bad flag prints a clear message to stderr and exits with status 2; -h prints
// the help and exits 0.
Args parseArgs(int argc, char** argv);

// "1K" -> 1024, "64M", "1G", plain numbers; false if malformed.
bool parseSize(const std::string& s, size_t* out);

}  // namespace perf
