// A transport with a progress thread: allreduces posted here run in order on that thread while the
// caller computes, which is how the pipelined schedule overlaps communication with computation.
// It is also a Transport: allreduce() runs inline on the caller's thread once nothing is pending,
// so callers that do not pipeline pay no thread hand-off. The progress thread starts at the first
// post and sleeps (condition variable) when it has nothing to do.
// Failure: this transport and the inner one share one failure record (Transport(Transport&)), so
// broken() and failure() are the same here and on the inner transport, whichever of the two found
// the failure (a posted job fails in the inner's allreduce, an inline call in this one's).
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
  const char* name() const override { return inner_->name(); }
  const TransportCounters& counters() const override { return inner_->counters(); }
  std::string info() const override { return inner_->info(); }

  // allreduce() (Transport's entry) is inline: it waits until no posted job is pending, then runs
  // on the caller's thread. After a posted job failed, every later call fails: the transport is
  // broken (a job that failed in the inner transport's run() broke the shared record; one refused
  // for its arguments is returned to the next inline call, which records it).

  // Queues an allreduce of buf (which must stay valid and untouched until waited for); the job
  // goes through the inner transport's allreduce (its checks, its failure record: this one's).
  Ticket post(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
              const Wire& wire = Wire{});
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
    Wire wire;
  };
  Status run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
             const Wire& wire) override;
  void onAbort() override;
  void progressLoop();  // the progress thread

  std::unique_ptr<Transport> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  Ticket posted_ = 0, done_ = 0;  // tickets are 1, 2, ...; done_ = the last one finished
  bool busy_ = false, stop_ = false;
  Status error_;  // the first error of a job (posted or inline): every later one gets it
  std::thread thread_;
};

}  // namespace lowrank
