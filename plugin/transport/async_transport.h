// A transport with a progress thread: allreduces posted here run in order on that thread while the
// caller computes, which is how the pipelined schedule overlaps communication with computation.
// It is also a Transport: allreduce() runs inline on the caller's thread once nothing is pending,
// so callers that do not pipeline pay no thread hand-off. The progress thread starts at the first
// post and sleeps (condition variable) when it has nothing to do.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "transport/transport.h"

namespace lowrank {

class AsyncTransport final : public Transport {
 public:
  using Ticket = uint64_t;

  explicit AsyncTransport(std::unique_ptr<Transport> inner);
  ~AsyncTransport() override;  // waits for the job in progress (bounded by the inner timeout)

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const TransportCounters& counters() const override { return inner_->counters(); }
  void abort() override;
  bool broken() const override { return inner_->broken(); }

  // Inline allreduce: waits until no posted job is pending, then runs on the caller's thread.
  Status allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) override;

  // Queues an allreduce of buf (which must stay valid and untouched until waited for).
  Ticket post(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op);
  // Waits until the job of `ticket` (and every job before it) has run; returns the first error of
  // any job up to it. After an error every later job is skipped and fails with that error.
  Status wait(Ticket ticket);
  // Waits for every posted job.
  Status waitAll();

 private:
  struct Job {
    void* buf;
    size_t count;
    lowrankDataType_t dtype;
    lowrankRedOp_t op;
  };
  void run();

  std::unique_ptr<Transport> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  Ticket posted_ = 0, done_ = 0;  // tickets are 1, 2, ...; done_ = the last one finished
  bool busy_ = false, stop_ = false;
  Status error_;
  std::thread thread_;
};

}  // namespace lowrank
