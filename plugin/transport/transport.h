// How bytes travel between comm ranks. A transport knows nothing of PowerSGD: it allreduces
// buffers of any lowrank dtype and op, deterministically (the same bits on every comm rank), and
// counts what it puts on the wire.
//
// One entry and one failure path for every transport (UCX, NCCL, the asynchronous one in front of
// either): Transport::allreduce checks the arguments, refuses a broken transport, runs the
// transport's own collective (run()) and records the first failure. A transport is broken once a
// collective failed midway or it was aborted; it stays broken.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lowrank/lowrank.h"
#include "transport/wire.h"
#include "util/status.h"

namespace lowrank {

struct TransportCounters {
  std::atomic<uint64_t> elementsSent{0};  // elements this rank sent to peers (all algorithms)
  std::atomic<uint64_t> bytesSent{0};     // bytes this rank sent to peers
  std::atomic<uint64_t> messages{0};      // point-to-point messages sent
};

class Transport {
 public:
  virtual ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "ucx", "nccl", ...: the first word of this transport's messages.
  virtual const char* name() const = 0;

  // In-place allreduce of `count` elements of `dtype` in `buf` with `op` (sum, prod, max, min, avg;
  // avg = sum then divided by size(), as ncclAvg). The result is bitwise identical on every rank.
  // count may be 0 (then only ordering/consistency of the call sequence is kept). Every wait is
  // bounded by the timeout given at creation; abort() makes a waiting call return promptly.
  // The one entry of every transport, in this order:
  //  1. arguments: dtype and op inside their enums, a buffer when count > 0, count * element size
  //     representable: else lowrankInvalidArgument, and the transport is NOT broken by it (nothing
  //     moved, every rank would refuse the same call);
  //  2. a broken transport refuses: lowrankInvalidUsage "<name> allreduce: the transport failed
  //     earlier: <the first failure>";
  //  3. run(), the transport's own collective;
  //  4. any error of run() breaks the transport (a collective that failed midway leaves the ranks
  //     out of step), its message kept if it is the first failure; an exception out of run() is
  //     such an error too (lowrankSystemError for memory, lowrankInternalError otherwise).
  // Errors of run(): lowrankRemoteError (peer gone, aborted while waiting), lowrankTimeout,
  // lowrankSystemError, lowrankInvalidUsage (counts that differ across ranks), and whatever the
  // library underneath returned (NCCL's codes, mapped).
  // wire (wire.h): a 16-bit part of a float32 buffer (16-bit factors); its checks are step 1's
  // (dtype float32, wire dtype bfloat16 or float16, lo <= hi <= count).
  Status allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                   const Wire& wire = Wire{});

  // Breaks the transport ("aborted", unless it failed before) and makes a waiting call return
  // promptly. Any thread may call it, any time.
  void abort();

  // True once a collective broke midway (a peer lost, a timeout, counts that differ across ranks,
  // any error of the library underneath) or the transport was aborted: the ranks may be out of
  // step, and the transport refuses every later call. Never false again once true.
  bool broken() const { return record_->broken.load(std::memory_order_acquire); }
  // The first failure's message ("" while not broken).
  std::string failure() const;

  virtual const TransportCounters& counters() const { return counters_; }

  // What this transport chose and measured, as one JSON object (lowrankCommGetTransportInfo):
  // at least {"transport": name()}. Any thread.
  virtual std::string info() const;

 protected:
  Transport();
  // For a transport in front of `inner` (AsyncTransport): both share inner's failure record, so
  // a failure recorded by either is the other's too (one truth, not two flags to keep in step).
  explicit Transport(Transport& inner);

  // The collective itself, called by allreduce() with checked arguments on a transport not
  // broken (count may be 0). Every error returned breaks the transport.
  // An active wire is passed only with dtype float32. A transport that cannot carry it itself
  // runs runSplit() (below).
  virtual Status run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                     const Wire& wire) = 0;
  // An allreduce with a 16-bit part as three of this transport's own: [0, lo) and [hi, count) in
  // float32, [lo, hi) converted to the wire dtype and summed in it by the library underneath
  // (NCCL sums 16-bit values in 16 bits), then converted back. What the NCCL transport does.
  Status runSplit(void* buf, size_t count, lowrankRedOp_t op, const Wire& wire);
  // Called by abort() after the transport is marked broken: wake whatever waits. Any thread.
  virtual void onAbort() {}

  // Marks the transport broken with `why` unless it already is (the first failure is kept).
  void recordFailure(const std::string& why);

  TransportCounters counters_;

 private:
  struct Record {
    std::atomic<bool> broken{false};
    std::atomic_flag writing = ATOMIC_FLAG_INIT;  // the first recordFailure writes `why`
    std::string why;                              // written once, before `broken` is set
  };
  std::shared_ptr<Record> record_;
};

}  // namespace lowrank
