#include "transport/reduce.h"
#include "transport/ucx/fold.h"

namespace lowrank::ucx {

Status halvingDoublingAllreduce(Exchange& ex, const AllreduceArgs& a, std::vector<std::byte>* scratch) {
  const Fold f(ex.size(), ex.rank());
  const size_t es = a.elemSize;
  if (scratch->size() < a.count * es) scratch->resize(a.count * es);
  auto* buf = static_cast<std::byte*>(a.buf);
  const Blocks b(a.count, f.p);
  uint32_t step = 0;
  LR_RETURN_IF_ERROR(foldIn(ex, f, a, scratch->data(), step++));
  if (f.extra()) return foldOut(ex, f, a, step + uint32_t(2 * f.log2p));
  Exchange::Handle h;
  // Reduce-scatter by halving: of the 2 * mask blocks [lo, lo + 2 mask) a pair shares, the lower
  // folded rank keeps the lower half. Each kept half is reduced by one rank only, then copied, so
  // every rank ends with the same bits. After it, folded rank v holds block v reduced.
  int lo = 0;
  for (int mask = f.p / 2; mask >= 1; mask /= 2, ++step) {
    const bool lower = (f.v & mask) == 0;
    const int peer = f.commRank(f.v ^ mask);
    const int keep = lower ? lo : lo + mask, give = lower ? lo + mask : lo;
    const size_t keepLen = b.span(keep, mask), giveLen = b.span(give, mask);
    if (keepLen) LR_RETURN_IF_ERROR(ex.recv(peer, step, scratch->data(), keepLen * es, &h));
    if (giveLen) LR_RETURN_IF_ERROR(ex.send(peer, step, buf + b.start(give) * es, giveLen * es, giveLen, &h));
    LR_RETURN_IF_ERROR(ex.waitAll());
    if (keepLen) combineInOrder(buf + b.start(keep) * es, scratch->data(), lower, keepLen, a);
    lo = keep;
  }
  if (a.op == lowrankAvg) transport::divideBy(buf + b.start(f.v) * es, b.len(f.v), a.dtype, ex.size());
  // Allgather by doubling: pairs swap the mask blocks each holds.
  for (int mask = 1; mask < f.p; mask *= 2, ++step) {
    const int peerV = f.v ^ mask, peer = f.commRank(peerV);
    const int mine = f.v - f.v % mask, theirs = peerV - peerV % mask;
    const size_t mineLen = b.span(mine, mask), theirLen = b.span(theirs, mask);
    if (theirLen) LR_RETURN_IF_ERROR(ex.recv(peer, step, buf + b.start(theirs) * es, theirLen * es, &h));
    if (mineLen) LR_RETURN_IF_ERROR(ex.send(peer, step, buf + b.start(mine) * es, mineLen * es, mineLen, &h));
    LR_RETURN_IF_ERROR(ex.waitAll());
  }
  return foldOut(ex, f, a, step);
}

}  // namespace lowrank::ucx
