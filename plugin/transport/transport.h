// How bytes travel between comm ranks. A transport knows nothing of PowerSGD: it allreduces
// buffers of any lowrank dtype and op, deterministically (the same bits on every comm rank), and
// counts what it puts on the wire.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

struct TransportCounters {
  std::atomic<uint64_t> elementsSent{0};  // elements this rank sent to peers (all algorithms)
  std::atomic<uint64_t> bytesSent{0};     // bytes this rank sent to peers
  std::atomic<uint64_t> messages{0};      // point-to-point messages sent
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place allreduce of `count` elements of `dtype` in `buf` with `op` (sum, prod, max, min, avg;
  // avg = sum then divided by size(), as ncclAvg). The result is bitwise identical on every rank.
  // count may be 0 (then only ordering/consistency of the call sequence is kept). Every wait is
  // bounded by the timeout given at creation; abort() makes a waiting call return promptly.
  // Errors: lowrankRemoteError (peer gone), lowrankTimeout, lowrankSystemError, lowrankInvalidUsage
  // (aborted or failed before).
  virtual Status allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) = 0;

  // Marks the transport failed; any thread may call it, any time.
  virtual void abort() = 0;

  // True once a collective broke midway (a peer lost, counts that differ across ranks, an abort):
  // the ranks may be out of step, and the transport refuses every later call.
  virtual bool broken() const { return false; }

  virtual const TransportCounters& counters() const { return counters_; }

 protected:
  TransportCounters counters_;
};

}  // namespace lowrank
