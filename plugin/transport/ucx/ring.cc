#include <algorithm>

#include "transport/reduce.h"
#include "transport/ucx/algorithms.h"
#include "transport/ucx/blocks.h"

namespace lowrank::ucx {
namespace {

// One chunk on its way through the 2(N-1) steps.
struct Slot {
  bool active = false;
  size_t chunk = 0;
  int step = 0;
  bool sending = false, receiving = false;
  Exchange::Handle send = 0, recv = 0;
};

}  // namespace

Status ringAllreduce(Exchange& ex, const AllreduceArgs& a, size_t chunkBytes, int inflight,
                     std::vector<std::byte>* scratch) {
  const int n = ex.size(), me = ex.rank();
  const int left = (me + n - 1) % n, right = (me + 1) % n, steps = 2 * (n - 1);
  const size_t es = a.elemSize;
  const Blocks seg(a.count, n);  // segment j: block j
  const size_t chunkElems = std::max<size_t>(1, chunkBytes / es);
  const size_t nchunks = (seg.len(0) + chunkElems - 1) / chunkElems;  // seg 0 is the longest
  const size_t nslots = std::min<size_t>(size_t(std::max(1, inflight)), nchunks);
  if (scratch->size() < nslots * chunkElems * es) scratch->resize(nslots * chunkElems * es);
  auto* buf = static_cast<std::byte*>(a.buf);
  auto mod = [n](long x) { return int(((x % n) + n) % n); };
  // Elements [*off, *off + *len) of chunk c of segment j.
  auto chunkOf = [&](int j, size_t c, size_t* off, size_t* len) {
    size_t l = seg.len(j), lo = std::min(l, c * chunkElems), hi = std::min(l, lo + chunkElems);
    *off = seg.start(j) + lo;
    *len = hi - lo;
  };
  // Step s: send segment (me - s) to the right, receive segment (me - s - 1) from the left; in the
  // reduce-scatter steps (s < n-1) into scratch, then reduced into place; in the allgather steps
  // directly into place. After step n-2, this rank holds the final segment me + 1.
  auto post = [&](Slot& s, size_t slotIndex) -> Status {
    const uint32_t index = uint32_t(uint64_t(s.step) * nchunks + s.chunk);
    size_t off, len;
    chunkOf(mod(long(me) - s.step - 1), s.chunk, &off, &len);
    s.receiving = len > 0;
    if (s.receiving) {
      std::byte* dst = s.step < n - 1 ? scratch->data() + slotIndex * chunkElems * es : buf + off * es;
      LR_RETURN_IF_ERROR(ex.recv(left, index, dst, len * es, &s.recv, off));
    }
    chunkOf(mod(long(me) - s.step), s.chunk, &off, &len);
    s.sending = len > 0;
    if (s.sending) LR_RETURN_IF_ERROR(ex.send(right, index, buf + off * es, len * es, len, &s.send));
    return Status::Ok();
  };
  auto finishStep = [&](Slot& s, size_t slotIndex) {
    if (s.step >= n - 1) return;
    size_t off, len;
    chunkOf(mod(long(me) - s.step - 1), s.chunk, &off, &len);
    if (len == 0) return;
    transport::reduceInto(buf + off * es, scratch->data() + slotIndex * chunkElems * es, len, a.dtype, a.op);
    if (s.step == n - 2 && a.op == lowrankAvg) transport::divideBy(buf + off * es, len, a.dtype, n);
  };

  std::vector<Slot> slots(nslots);
  size_t nextChunk = 0, active = 0;
  for (size_t i = 0; i < nslots; ++i) {
    slots[i] = Slot{true, nextChunk++, 0};
    ++active;
    LR_RETURN_IF_ERROR(post(slots[i], i));
  }
  while (active > 0) {
    bool advanced = false;
    for (size_t i = 0; i < nslots; ++i) {
      Slot& s = slots[i];
      if (!s.active) continue;
      bool done;
      if (s.receiving) {
        LR_RETURN_IF_ERROR(ex.test(s.recv, &done));
        if (!done) continue;
        s.receiving = false;
      }
      if (s.sending) {
        LR_RETURN_IF_ERROR(ex.test(s.send, &done));
        if (!done) continue;
        s.sending = false;
      }
      finishStep(s, i);
      advanced = true;
      if (++s.step == steps) {
        if (nextChunk == nchunks) {
          s.active = false;
          --active;
          continue;
        }
        s.chunk = nextChunk++;
        s.step = 0;
      }
      LR_RETURN_IF_ERROR(post(s, i));
    }
    if (!advanced && active > 0) LR_RETURN_IF_ERROR(ex.progress());
  }
  return Status::Ok();
}

}  // namespace lowrank::ucx
