// How the host algorithms split a buffer and a world, shared by the algorithms and their cost model
// (cost_model.h), so that what is sent and what is modelled cannot drift apart.
#pragma once
#include <algorithm>
#include <cstddef>

namespace lowrank::ucx {

// log2 of the largest power of two <= n (n >= 1), and that power: the folded world.
inline int log2Floor(int n) {
  int l = 0;
  while ((2L << l) <= n) ++l;
  return l;
}
inline int foldedWorld(int n) { return 1 << log2Floor(n); }

// count elements in n balanced blocks: block j is [start(j), start(j) + len(j)), the first
// count % n blocks one element longer.
struct Blocks {
  size_t base, rem;
  Blocks(size_t count, int n) : base(count / size_t(n)), rem(count % size_t(n)) {}
  size_t start(int j) const { return size_t(j) * base + std::min(size_t(j), rem); }
  size_t len(int j) const { return base + (size_t(j) < rem ? 1 : 0); }
  size_t span(int first, int k) const { return start(first + k) - start(first); }  // blocks [first, first+k)
};

// The usual fold of a world that is not a power of two: n = p + r with p the largest power of two
// <= n. Comm ranks 0, 2, .., 2r-2 are extra: each hands its buffer to the next odd rank and gets the
// result back at the end. The other p ranks take folded ranks v = 0..p-1 in comm-rank order, so a
// lower folded rank is a lower comm rank.
struct Fold {
  int p, log2p, r, rank, v;
  Fold(int n, int commRank)
      : p(foldedWorld(n)), log2p(log2Floor(n)), r(n - p), rank(commRank),
        v(rank < 2 * r ? (rank % 2 ? rank / 2 : -1) : rank - r) {}
  bool extra() const { return v < 0; }
  bool hasExtra() const { return v >= 0 && rank < 2 * r; }  // an odd rank below 2r
  int commRank(int folded) const { return folded < r ? 2 * folded + 1 : folded + r; }
};

}  // namespace lowrank::ucx
