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

// Calls f(off, len) for each range of the buffer comm rank `rank` of n sends in one allreduce of
// count elements, as the algorithm splits it (chunks aside: bytes add up over a range's parts).
template <class F>
void forEachSent(Algorithm a, int n, int rank, size_t count, F f) {
  switch (a) {
    case Algorithm::Direct:
      for (int p = 1; p < n; ++p) f(size_t(0), count);
      return;
    case Algorithm::Ring: {
      // Step s sends segment rank - s: every segment but rank+1 (reduce-scatter) and rank+2 (allgather).
      const Blocks seg(count, n);
      for (int s = 0; s < 2 * (n - 1); ++s) {
        const int j = ((rank - s) % n + n) % n;
        f(seg.start(j), seg.len(j));
      }
      return;
    }
    case Algorithm::RecursiveDoubling:
    case Algorithm::HalvingDoubling: {
      const Fold fo(n, rank);
      if (fo.extra()) return f(size_t(0), count);  // its buffer to its partner, nothing more
      if (a == Algorithm::RecursiveDoubling) {
        for (int l = 0; l < fo.log2p; ++l) f(size_t(0), count);
      } else {
        // The half its partner keeps at each halving, then all it holds at each doubling.
        const Blocks b(count, fo.p);
        int lo = 0;
        for (int mask = fo.p / 2; mask >= 1; mask /= 2) {
          const bool lower = (fo.v & mask) == 0;
          const int give = lower ? lo + mask : lo;
          f(b.start(give), b.span(give, mask));
          if (!lower) lo += mask;
        }
        for (int mask = 1; mask < fo.p; mask *= 2) {
          const int mine = fo.v - fo.v % mask;
          f(b.start(mine), b.span(mine, mask));
        }
      }
      if (fo.hasExtra()) f(size_t(0), count);  // the result back to the extra rank
      return;
    }
  }
}

}  // namespace

uint64_t bytesSent(Algorithm a, int n, int rank, size_t count, size_t elemSize) {
  uint64_t elems = 0;
  if (n >= 2) forEachSent(a, n, rank, count, [&](size_t, size_t len) { elems += len; });
  return elems * elemSize;
}

uint64_t bytesSent(Algorithm a, int n, int rank, size_t count, const Wire& wire) {
  uint64_t bytes = 0;
  if (n >= 2) forEachSent(a, n, rank, count, [&](size_t off, size_t len) { bytes += wire.bytes(off, len); });
  return bytes;
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

Algorithm choose(int n, double bytes, const CostParams& c, int directMaxRanks, bool wire16) {
  bool allowed[kNumAlgorithms];
  double sec[kNumAlgorithms], fastest = 0;
  bool any = false;
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const auto a = Algorithm(i);
    allowed[i] = !(a == Algorithm::Direct && n > directMaxRanks) && !(wire16 && !roundsBounded(a, n));
    sec[i] = modelledSeconds(a, n, bytes, c);
    if (allowed[i] && (!any || sec[i] < fastest)) fastest = sec[i], any = true;
  }
  // Among those the model cannot tell from the fastest: the fewest bytes, then the least time,
  // then the enum's order.
  int best = -1;
  for (int i = 0; i < kNumAlgorithms; ++i) {
    if (!allowed[i] || sec[i] > fastest * (1 + kNearMargin)) continue;
    const double b = busiestBytes(Algorithm(i), n, bytes);
    const double bb = best < 0 ? 0 : busiestBytes(Algorithm(best), n, bytes);
    if (best < 0 || b < bb || (b == bb && sec[i] < sec[best])) best = i;
  }
  return best < 0 ? Algorithm::Ring : Algorithm(best);
}

}  // namespace lowrank::ucx
