#include "transport/ucx/fold.h"

#include <cstring>

#include "transport/reduce.h"
#include "transport/wire.h"

namespace lowrank::ucx {

void combineInOrder(void* mine, void* theirs, bool mineIsLower, size_t count, const AllreduceArgs& a) {
  if (mineIsLower) {
    transport::reduceInto(mine, theirs, count, a.dtype, a.op);
  } else {
    transport::reduceInto(theirs, mine, count, a.dtype, a.op);
    std::memcpy(mine, theirs, count * a.elemSize);
  }
}

Status foldIn(Exchange& ex, const Fold& f, const AllreduceArgs& a, std::byte* scratch, uint32_t index) {
  const size_t bytes = a.count * a.elemSize;
  Exchange::Handle h;
  if (f.extra()) {
    LR_RETURN_IF_ERROR(ex.send(f.rank + 1, index, a.buf, bytes, a.count, &h));
    return ex.waitAll();  // the result will be received into the same buffer
  }
  if (!f.hasExtra()) return Status::Ok();
  LR_RETURN_IF_ERROR(ex.recv(f.rank - 1, index, scratch, bytes, &h, 0));
  LR_RETURN_IF_ERROR(ex.waitAll());
  combineInOrder(a.buf, scratch, /*mineIsLower=*/false, a.count, a);
  return Status::Ok();
}

Status foldOut(Exchange& ex, const Fold& f, const AllreduceArgs& a, uint32_t index) {
  const size_t bytes = a.count * a.elemSize;
  Exchange::Handle h;
  // A 16-bit part: the extra ranks get the result as a wire value, so every core rank rounds it
  // alike (recursive doubling ends in float32; the partner's send would round its copy alone).
  if (!f.extra() && f.r > 0 && a.wire.active())
    wire::round(a.wire, 0, a.count, static_cast<float*>(a.buf));
  if (f.extra()) {
    LR_RETURN_IF_ERROR(ex.recv(f.rank + 1, index, a.buf, bytes, &h));
  } else if (f.hasExtra()) {
    LR_RETURN_IF_ERROR(ex.send(f.rank - 1, index, a.buf, bytes, a.count, &h));
  }
  return ex.waitAll();
}

}  // namespace lowrank::ucx
