#include <cstring>

#include "transport/reduce.h"
#include "transport/ucx/algorithms.h"

namespace lowrank::ucx {

Status directAllreduce(Exchange& ex, const AllreduceArgs& a, std::vector<std::byte>* scratch) {
  const int n = ex.size(), me = ex.rank();
  const size_t bytes = a.count * a.elemSize;
  if (scratch->size() < size_t(n) * bytes) scratch->resize(size_t(n) * bytes);
  std::byte* slot = scratch->data();  // contribution of comm rank p at slot + p * bytes
  Exchange::Handle h;
  for (int k = 1; k < n; ++k) {
    int p = (me + n - k) % n;
    LR_RETURN_IF_ERROR(ex.recv(p, 0, slot + size_t(p) * bytes, bytes, &h, 0));
  }
  for (int k = 1; k < n; ++k) {
    int p = (me + k) % n;
    LR_RETURN_IF_ERROR(ex.send(p, 0, a.buf, bytes, a.count, &h));
  }
  LR_RETURN_IF_ERROR(ex.waitAll());
  // acc = c_0; acc = acc op c_p for p = 1 .. n-1, on every rank alike.
  if (me != 0) {
    std::memcpy(slot + size_t(me) * bytes, a.buf, bytes);
    std::memcpy(a.buf, slot, bytes);
  }
  for (int p = 1; p < n; ++p)
    transport::reduceInto(a.buf, slot + size_t(p) * bytes, a.count, a.dtype, a.op);
  if (a.op == lowrankAvg) transport::divideBy(a.buf, a.count, a.dtype, n);
  return Status::Ok();
}

}  // namespace lowrank::ucx
