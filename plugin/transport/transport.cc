// Transport's one entry: argument checks, the broken state and the first failure, for every
// transport.
#include "transport/transport.h"

#include <cstdint>
#include <exception>
#include <new>
#include <vector>

#include "transport/reduce.h"
#include "util/dtype.h"

namespace lowrank {

Transport::Transport() : record_(std::make_shared<Record>()) {}
Transport::Transport(Transport& inner) : record_(inner.record_) {}
Transport::~Transport() = default;

std::string Transport::info() const { return std::string("{\"transport\": \"") + name() + "\"}"; }

std::string Transport::failure() const {
  return broken() ? record_->why : std::string();
}

void Transport::recordFailure(const std::string& why) {
  if (record_->writing.test_and_set(std::memory_order_acq_rel)) return;  // not the first
  record_->why = why;
  record_->broken.store(true, std::memory_order_release);
}

void Transport::abort() {
  recordFailure(std::string(name()) + ": the transport was aborted");
  onAbort();
}

Status Transport::allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                            const Wire& wire) {
  if (!transport::reductionValid(dtype, op))
    return Status::Error(lowrankInvalidArgument, "%s allreduce: invalid dtype %d or op %d", name(),
                         int(dtype), int(op));
  if (wire.dtype != lowrankFloat32 &&
      ((wire.dtype != lowrankBfloat16 && wire.dtype != lowrankFloat16) || dtype != lowrankFloat32 ||
       wire.lo > wire.hi || wire.hi > count))
    return Status::Error(lowrankInvalidArgument,
                         "%s allreduce: a 16-bit part [%zu, %zu) as dtype %d of %zu elements of %s: "
                         "needs float32, bfloat16 or float16 on the wire, lo <= hi <= count", name(),
                         wire.lo, wire.hi, int(wire.dtype), count, dtypeName(dtype));
  if (count > 0 && !buf)
    return Status::Error(lowrankInvalidArgument, "%s allreduce: null buffer (count %zu)", name(), count);
  if (count > SIZE_MAX / dtypeSize(dtype))
    return Status::Error(lowrankInvalidArgument, "%s allreduce: count %zu of %s overflows", name(),
                         count, dtypeName(dtype));
  if (broken())
    return Status::Error(lowrankInvalidUsage, "%s allreduce: the transport failed earlier: %s", name(),
                         failure().c_str());
  Status s;
  try {
    s = run(buf, count, dtype, op, wire);
  } catch (const std::bad_alloc&) {
    s = Status::Error(lowrankSystemError, "%s allreduce: out of memory", name());
  } catch (const std::exception& e) {
    s = Status::Error(lowrankInternalError, "%s allreduce: %s", name(), e.what());
  }
  if (!s.ok()) recordFailure(s.msg);
  return s;
}

}  // namespace lowrank

namespace lowrank {

Status Transport::runSplit(void* buf, size_t count, lowrankRedOp_t op, const Wire& wire) {
  float* f = static_cast<float*>(buf);
  if (!wire.active()) return run(buf, count, lowrankFloat32, op, Wire{});
  std::vector<uint16_t> h(wire.hi - wire.lo);
  Wire all{wire.dtype, 0, h.size()};  // the whole staging buffer is the 16-bit part
  wire::encode(all, 0, h.size(), f + wire.lo, h.data());
  Status s = run(f, wire.lo, lowrankFloat32, op, Wire{});
  if (s.ok()) s = run(h.data(), h.size(), wire.dtype, op, Wire{});
  if (s.ok()) s = run(f + wire.hi, count - wire.hi, lowrankFloat32, op, Wire{});
  if (s.ok()) wire::decode(all, 0, h.size(), h.data(), f + wire.lo);
  return s;
}

}  // namespace lowrank
