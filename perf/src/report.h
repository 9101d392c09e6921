// The output of lowrank_allreduce_perf: nccl-tests' table (plus lowrank's columns) on stdout and
// nccl-tests' JSON layout (plus a "lowrank" object per result) in the -J file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "lowrank/lowrank.h"

namespace perf {

struct Placement {
  double timeUs = 0;  // average per call, max over comm ranks
  double algBw = 0;   // GB/s: size / time
  double busBw = 0;   // GB/s: algBw * 2 (N - 1) / N
  std::optional<uint64_t> nwrong;  // summed over comm ranks; nullopt with -c 0
};

struct Row {
  size_t size = 0, count = 0;
  lowrankDataType_t type = lowrankFloat32;
  lowrankRedOp_t op = lowrankSum;
  Placement outOfPlace, inPlace;
  Mode mode = Mode::PowerSgd;
  int k = 0;
  bool alternate = false;  // the powersgd row ran alternating PowerSGD (LOWRANK_ALTERNATE)
  std::string factorDtype;  // the powersgd row: its factors on the wire, "fp32", "bf16", "fp16"
  std::optional<uint64_t> wireBytes;
  std::optional<double> ratio, relerr, cumrelerr, relerrOpt;
  bool expectExact = false;  // #wrong counts as out of bounds (inputs with an exact answer)
  // Each phase alone (bench.cc): compute on 1-rank communicators, comm = the payload's exact
  // allreduces; the bandwidth bound of the compute and the fraction of it reached.
  std::optional<double> computeUs, commUs, boundUs, boundAloneUs, computeEff;
  std::optional<uint64_t> pElements, qElements, exactElements;
};

// The triad measured at start (GB/s, 12 B per element); nullopt when not measured.
struct TriadResult {
  std::optional<double> alone;   // this process's rank 0 alone on the machine (1 thread)
  std::optional<double> shared;  // per comm rank, all comm ranks running it at once (min over ranks)
  int concurrent = 1;            // comm ranks that ran it at once
};

class Report {
 public:
  explicit Report(FILE* out) : out_(out) {}
  // Free-form '#' lines before the table.
  void note(const std::string& line);
  void setTriad(const TriadResult& t) { triad_ = t; }
  void header();
  void row(const Row& r);
  // Prints the footer; returns the out-of-bounds count (#wrong of rows that expect exactness).
  uint64_t footer();
  // Writes the JSON file; false (with a message on stderr) if it cannot be written.
  bool writeJson(const std::string& path, const Args& args, int nranks) const;

 private:
  FILE* out_;
  std::vector<Row> rows_;
  TriadResult triad_;
  uint64_t outOfBounds_ = 0;
  double avgBusBw_ = 0;
};

}  // namespace perf
