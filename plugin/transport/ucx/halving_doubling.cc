#include <algorithm>

#include "transport/reduce.h"
#include "transport/ucx/fold.h"

namespace lowrank::ucx {
namespace {

// Message indices of one step: its chunks, as many as the longest span of `mask` blocks (the first
// one: the longer blocks come first) has. The same on every rank, so the indices of a pair agree.
uint32_t stepChunks(const Blocks& b, int mask, size_t chunkElems) {
  return uint32_t((b.span(0, mask) + chunkElems - 1) / chunkElems);
}

// One step's exchange with one peer: receive recvLen elements into recvDst (elements recvAt.. of
// the buffer, for a 16-bit wire) and send sendLen
// elements from sendSrc, each split into chunks of <= chunkElems (the peer splits alike: its send
// is this rank's receive), chunk c both ways under message index base + c, up to `inflight`
// chunks at once. onChunk(off, len) runs as soon as the received chunk [off, off + len) of
// recvDst has arrived, while later chunks are still on the wire: the reduction of one chunk
// overlaps the transfer of the next ones. Chunks are independent: a chunk's elements are only
// ever combined with the same elements of the peer, so the split leaves every result bit as it
// is unsplit.
template <class OnChunk>
Status exchangeChunked(Exchange& ex, int peer, uint32_t base, std::byte* recvDst, size_t recvAt,
                       size_t recvLen,
                       const std::byte* sendSrc, size_t sendLen, size_t es, size_t chunkElems,
                       int inflight, OnChunk onChunk) {
  const size_t nchunks = (std::max(recvLen, sendLen) + chunkElems - 1) / chunkElems;
  struct Slot {
    size_t chunk;
    bool receiving, sending;
    Exchange::Handle recv, send;
  };
  auto part = [chunkElems](size_t len, size_t c, size_t* off) {  // chunk c of len elements
    *off = std::min(len, c * chunkElems);
    return std::min(len, *off + chunkElems) - *off;
  };
  auto post = [&](Slot& s) -> Status {
    size_t off, len;
    if ((len = part(recvLen, s.chunk, &off)) > 0)
      LR_RETURN_IF_ERROR(ex.recv(peer, base + uint32_t(s.chunk), recvDst + off * es, len * es, &s.recv,
                                 recvAt + off));
    s.receiving = len > 0;
    if ((len = part(sendLen, s.chunk, &off)) > 0)
      LR_RETURN_IF_ERROR(ex.send(peer, base + uint32_t(s.chunk), sendSrc + off * es, len * es, len, &s.send));
    s.sending = len > 0;
    return Status::Ok();
  };
  std::vector<Slot> slots;
  size_t next = 0;
  // Every receive of the window is posted before its send, so the peer's data never waits.
  while (next < nchunks && slots.size() < size_t(std::max(1, inflight))) {
    slots.push_back(Slot{next++, false, false, 0, 0});
    LR_RETURN_IF_ERROR(post(slots.back()));
  }
  size_t active = slots.size();
  while (active > 0) {
    bool advanced = false;
    for (Slot& s : slots) {
      if (!s.receiving && !s.sending && s.chunk == nchunks) continue;  // retired
      bool done;
      if (s.receiving) {
        LR_RETURN_IF_ERROR(ex.test(s.recv, &done));
        if (done) {
          s.receiving = false;
          size_t off, len = part(recvLen, s.chunk, &off);
          onChunk(off, len);
          advanced = true;
        }
      }
      if (s.sending) {
        LR_RETURN_IF_ERROR(ex.test(s.send, &done));
        if (done) s.sending = false, advanced = true;
      }
      if (s.receiving || s.sending) continue;
      if (next < nchunks) {
        s.chunk = next++;
        LR_RETURN_IF_ERROR(post(s));
      } else {
        s.chunk = nchunks;
        --active;
      }
    }
    if (!advanced && active > 0) LR_RETURN_IF_ERROR(ex.progress());
  }
  return Status::Ok();
}

}  // namespace

Status halvingDoublingAllreduce(Exchange& ex, const AllreduceArgs& a, size_t chunkBytes, int inflight,
                                std::vector<std::byte>* scratch) {
  const Fold f(ex.size(), ex.rank());
  const size_t es = a.elemSize;
  const size_t chunkElems = std::max<size_t>(1, chunkBytes / es);
  if (scratch->size() < a.count * es) scratch->resize(a.count * es);
  auto* buf = static_cast<std::byte*>(a.buf);
  auto* tmp = scratch->data();
  const Blocks b(a.count, f.p);
  // Message 0: the fold in; then each step's chunks; then the fold out.
  uint32_t index = 0;
  LR_RETURN_IF_ERROR(foldIn(ex, f, a, tmp, index++));
  if (f.extra()) {
    for (int mask = f.p / 2; mask >= 1; mask /= 2) index += 2 * stepChunks(b, mask, chunkElems);
    return foldOut(ex, f, a, index);
  }
  // Reduce-scatter by halving: of the 2 * mask blocks [lo, lo + 2 mask) a pair shares, the lower
  // folded rank keeps the lower half. Each kept half is reduced by one rank only, then copied, so
  // every rank ends with the same bits. After it, folded rank v holds block v reduced. The peer's
  // half lands in scratch at its own offset and is combined chunk by chunk as it arrives.
  int lo = 0;
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    const bool lower = (f.v & mask) == 0;
    const int peer = f.commRank(f.v ^ mask);
    const int keep = lower ? lo : lo + mask, give = lower ? lo + mask : lo;
    const size_t keepAt = b.start(keep) * es;
    LR_RETURN_IF_ERROR(exchangeChunked(
        ex, peer, index, tmp + keepAt, b.start(keep), b.span(keep, mask), buf + b.start(give) * es, b.span(give, mask),
        es, chunkElems, inflight, [&](size_t off, size_t len) {
          combineInOrder(buf + keepAt + off * es, tmp + keepAt + off * es, lower, len, a);
        }));
    index += stepChunks(b, mask, chunkElems);
    lo = keep;
  }
  if (a.op == lowrankAvg) transport::divideBy(buf + b.start(f.v) * es, b.len(f.v), a.dtype, ex.size());
  // Allgather by doubling: pairs swap the mask blocks each holds, straight into place.
  for (int mask = 1; mask < f.p; mask *= 2) {
    const int peerV = f.v ^ mask, peer = f.commRank(peerV);
    const int mine = f.v - f.v % mask, theirs = peerV - peerV % mask;
    LR_RETURN_IF_ERROR(exchangeChunked(ex, peer, index, buf + b.start(theirs) * es, b.start(theirs),
                                       b.span(theirs, mask),
                                       buf + b.start(mine) * es, b.span(mine, mask), es, chunkElems,
                                       inflight, [](size_t, size_t) {}));
    index += stepChunks(b, mask, chunkElems);
  }
  return foldOut(ex, f, a, index);
}

}  // namespace lowrank::ucx
