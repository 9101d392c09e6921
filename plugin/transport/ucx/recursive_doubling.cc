#include "transport/reduce.h"
#include "transport/ucx/fold.h"

namespace lowrank::ucx {

Status recursiveDoublingAllreduce(Exchange& ex, const AllreduceArgs& a, std::vector<std::byte>* scratch) {
  const Fold f(ex.size(), ex.rank());
  const size_t bytes = a.count * a.elemSize;
  if (scratch->size() < bytes) scratch->resize(bytes);
  uint32_t step = 0;
  LR_RETURN_IF_ERROR(foldIn(ex, f, a, scratch->data(), step++));
  if (!f.extra()) {
    // After the exchange at distance mask, the 2 * mask folded ranks of a group hold the same bits
    // (by induction, and the pair combines in one order), so every rank ends with the same result.
    for (int mask = 1; mask < f.p; mask *= 2, ++step) {
      const int peerV = f.v ^ mask, peer = f.commRank(peerV);
      Exchange::Handle h;
      LR_RETURN_IF_ERROR(ex.recv(peer, step, scratch->data(), bytes, &h, 0));
      LR_RETURN_IF_ERROR(ex.send(peer, step, a.buf, bytes, a.count, &h));
      LR_RETURN_IF_ERROR(ex.waitAll());
      combineInOrder(a.buf, scratch->data(), f.v < peerV, a.count, a);
    }
    if (a.op == lowrankAvg) transport::divideBy(a.buf, a.count, a.dtype, ex.size());
  } else {
    step += uint32_t(f.log2p);  // the same index for the fold-out message
  }
  return foldOut(ex, f, a, step);
}

}  // namespace lowrank::ucx
