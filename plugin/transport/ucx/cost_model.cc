#include "transport/ucx/cost_model.h"

namespace lowrank::ucx {

int steps(Algorithm a, int n) {
  const int fold = foldedWorld(n) == n ? 0 : 2;
  switch (a) {
    case Algorithm::Ring: return 2 * (n - 1);
    case Algorithm::HalvingDoubling: return 2 * log2Floor(n) + fold;
    case Algorithm::RecursiveDoubling: return log2Floor(n) + fold;
    case Algorithm::Direct: return 1;
  }
  return 0;
}

int extraMessages(Algorithm a, int n) { return a == Algorithm::Direct ? 2 * (n - 2) : 0; }

namespace {

// Elements a core comm rank (folded rank v of p) sends in the halving reduce-scatter and the
// doubling allgather: the half its partner keeps at each halving, then all it holds at each doubling.
uint64_t halvingDoublingElements(int p, int v, size_t count) {
  const Blocks b(count, p);
  uint64_t sent = 0;
  int lo = 0;
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const bool lower = (v & mask) == 0;
    sent += b.span(lower ? lo + mask : lo, mask);
    if (!lower) lo += mask;
  }
  for (int mask = 1; mask < p; mask *= 2) sent += b.span(v - v % mask, mask);
  return sent;
}

}  // namespace

uint64_t bytesSent(Algorithm a, int n, int rank, size_t count, size_t elemSize) {
  if (n < 2 || count == 0) return 0;
  const uint64_t buffer = uint64_t(count);
  uint64_t elems = 0;
  switch (a) {
    case Algorithm::Direct: elems = uint64_t(n - 1) * buffer; break;
    case Algorithm::Ring: {
      // Step s sends segment rank - s: every segment but rank+1 (reduce-scatter) and rank+2 (allgather).
      const Blocks seg(count, n);
      elems = 2 * buffer - seg.len((rank + 1) % n) - seg.len((rank + 2) % n);
      break;
    }
    case Algorithm::RecursiveDoubling:
    case Algorithm::HalvingDoubling: {
      const Fold f(n, rank);
      if (f.extra()) return buffer * elemSize;  // its buffer to its partner, nothing more
      elems = a == Algorithm::RecursiveDoubling ? uint64_t(log2Floor(n)) * buffer
                                                : halvingDoublingElements(f.p, f.v, count);
      if (f.hasExtra()) elems += buffer;  // the result back to the extra rank
      break;
    }
  }
  return elems * elemSize;
}

double busiestBytes(Algorithm a, int n, double bytes) {
  const int p = foldedWorld(n);
  const double fold = p == n ? 0 : bytes;
  switch (a) {
    case Algorithm::Direct: return (n - 1) * bytes;
    case Algorithm::Ring: return 2.0 * (n - 1) / n * bytes;
    case Algorithm::RecursiveDoubling: return log2Floor(n) * bytes + fold;
    case Algorithm::HalvingDoubling: return 2.0 * (p - 1) / p * bytes + fold;
  }
  return 0;
}

double modelledSeconds(Algorithm a, int n, double bytes, const CostParams& c) {
  return steps(a, n) * c.alphaSec + extraMessages(a, n) * c.overheadSec +
         busiestBytes(a, n, bytes) * c.betaSecPerByte;
}

Algorithm choose(int n, double bytes, const CostParams& c, int directMaxRanks) {
  Algorithm best = Algorithm::Ring;
  double bestSec = modelledSeconds(best, n, bytes, c);
  for (int i = 1; i < kNumAlgorithms; ++i) {
    const auto a = Algorithm(i);
    if (a == Algorithm::Direct && n > directMaxRanks) continue;
    const double t = modelledSeconds(a, n, bytes, c);
    if (t < bestSec) best = a, bestSec = t;
  }
  return best;
}

}  // namespace lowrank::ucx
