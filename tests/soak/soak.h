// The soak run of lowrank's host engine: comm ranks as threads of this process, a long seeded mix
// of allreduces (compressed and exact, in place and out of place, every compressible dtype,
// batched and per-tensor layouts) with resets, releases, layout and count changes between them.
// It checks, at random calls, exact results bit for bit and the error-feedback invariant against
// the residuals the engine holds; and that memory returns once every buffer is released.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lowrank::soak {

struct Options {
  uint64_t seed = 1;   // the whole run follows from it
  size_t calls = 300;  // allreduces, each made by every comm rank
  int ranks = 4;
  size_t maxCount = size_t(16) << 20;  // buffer sizes are log-uniform in [1, maxCount]
  double capBytes =
      double(1u << 30);              // live state of all ranks (residuals dominate) kept under this
  double checkProb = 0.2;            // chance that a call is checked against its reference
  size_t rssMarginBytes = 64000000;  // resident memory with no buffer: baseline + this
  std::string csv;                   // memory curve, one row per call; empty: none
  bool progress = false;             // a line on stderr every 500 calls
  // Test of the soak itself: from this call on, the first float32 compressed call is checked, with
  // one element of comm rank 0's residual moved (by 1% of the buffer's input scale) before the
  // check.
  size_t corruptResidualFrom = SIZE_MAX;
};

struct Report {
  size_t calls = 0, compressed = 0, nonFinite = 0, fallbacks = 0, exactOnSlot = 0, exactTemp = 0;
  size_t invariantChecks = 0, exactChecks = 0, nonFiniteChecks = 0;
  size_t buffersMade = 0, resets = 0, releases = 0, layoutChanges = 0, reshapes = 0, drains = 0;
  size_t largestCount = 0;
  double worstTolFraction = 0;  // largest invariant error / its tolerance (fails above 1)
  double worstRelError = 0;     // largest invariant error / sum over the calls of max |G|
  size_t rssBaseline = 0, rssPeak = 0, rssEnd = 0, rssEndUntrimmed = 0, rssWorstDrain = 0;
  uint64_t statePeak = 0, stateEnd = 0, buffersEnd = 0;
  double seconds = 0, secondsAllReduce = 0;  // in all; in lowrankAllReduce (up to the last rank)
  double secondsReference = 0;               // making inputs and references before the calls
  std::vector<std::string> failures;         // empty when every check passed
};

// Runs the soak; the report says what was checked, the largest errors and the memory figures.
Report runSoak(const Options& opt);

}  // namespace lowrank::soak
