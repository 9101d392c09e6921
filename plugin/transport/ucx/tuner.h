// Online tuning of the host allreduce algorithm (LOWRANK_UCX_ALGO=tune), as STAR-MPI and ADCL do:
// PowerSGD's message sizes repeat every step, so the first calls of each size class run the
// candidate algorithms in turn on the real data and are timed; after the last trial the comm ranks
// agree on the timings (an allreduce, max over ranks, with one fixed algorithm) and every rank
// freezes the same choice for that class: the argmin of the agreed timings. The comm ranks cannot
// diverge: the trial order depends only on the call sequence, and the choice only on agreed numbers.
//
// Pure bookkeeping (no UCX); the transport (ucx_transport.cc) times the calls and runs the
// agreement. Thread safety: none; one per transport, used by its calling thread.
#pragma once
#include <array>
#include <cstddef>
#include <vector>

#include "transport/ucx/cost_model.h"

namespace lowrank::ucx {

// What a size class's tuning measured and chose (logged at INFO, passed to
// UcxTransportOptions::onTuned).
struct TuneResult {
  int sizeClass = 0;                    // floor(log2(bytes)): calls of [2^c, 2^(c+1)) bytes
  std::vector<Algorithm> candidates;    // in trial order (the enum's, direct only if allowed)
  std::vector<double> localSec;         // this comm rank's median over repeats, per candidate
  std::vector<double> agreedSec;        // the max of localSec over comm ranks, per candidate
  Algorithm choice = Algorithm::Ring;   // argmin of agreedSec, ties to the earlier candidate
};

class Tuner {
 public:
  // n comm ranks; direct is a candidate only while n <= directMaxRanks (as in choose()); each
  // candidate runs `repeats` times per size class (round-robin), so a class spends
  // candidates * repeats calls on trials.
  Tuner(int n, int directMaxRanks, int repeats);

  static int sizeClass(double bytes);  // floor(log2(bytes)), bytes >= 1

  struct Plan {
    Algorithm algo;
    bool trial;  // timed: record() its seconds
  };
  // The algorithm of the next call of `bytes`: the class's frozen choice, or its next trial.
  Plan plan(double bytes) const;

  // Records the seconds of the trial plan() gave; true when it was the class's last trial, so the
  // caller must agree now: localTimings(), allreduce them with max, then freeze().
  bool record(double bytes, double seconds);
  std::vector<double> localTimings(double bytes) const;  // median over repeats, per candidate
  const TuneResult& freeze(double bytes, const std::vector<double>& agreedSec);

  const std::vector<Algorithm>& candidates() const { return candidates_; }
  int trialsPerClass() const { return int(candidates_.size()) * repeats_; }

  static constexpr int kClasses = 64;  // size classes: floor(log2(bytes)) in [0, 64)

 private:
  struct Class {
    int trials = 0;               // trials recorded so far
    std::vector<double> seconds;  // trial i: candidate i % K
    bool frozen = false;
    TuneResult result;
  };
  std::vector<Algorithm> candidates_;
  int repeats_;
  std::array<Class, kClasses> classes_;
};

// The fixed algorithm of the agreement: recursive doubling (any world, log2 steps, a few doubles).
inline constexpr Algorithm kAgreementAlgorithm = Algorithm::RecursiveDoubling;

}  // namespace lowrank::ucx
