#include "transport/async_transport.h"

namespace lowrank {

AsyncTransport::AsyncTransport(std::unique_ptr<Transport> inner)
    : Transport(*inner), inner_(std::move(inner)) {}

AsyncTransport::~AsyncTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncTransport::onAbort() {
  inner_->abort();  // a job blocked on a peer returns promptly
  cv_.notify_all();
}

Status AsyncTransport::run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
                           const Wire& wire) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (!error_.ok()) return error_;
  busy_ = true;  // the progress thread (if any) stays off the transport meanwhile
  lock.unlock();
  Status s = inner_->allreduce(buf, count, dtype, op, wire);
  lock.lock();
  busy_ = false;
  if (!s.ok() && error_.ok()) error_ = s;
  lock.unlock();
  cv_.notify_all();
  return s;
}

AsyncTransport::Ticket AsyncTransport::post(void* buf, size_t count, lowrankDataType_t dtype,
                                            lowrankRedOp_t op, const Wire& wire) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { progressLoop(); });
  queue_.push_back(Job{buf, count, dtype, op, wire});
  cv_.notify_all();
  return ++posted_;
}

Status AsyncTransport::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  return error_;
}

Status AsyncTransport::waitAll() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = posted_;
  }
  return wait(last);
}

void AsyncTransport::progressLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;  // stop_ with nothing left
    Job job = queue_.front();
    queue_.pop_front();
    busy_ = true;
    const bool skip = !error_.ok();
    lock.unlock();
    Status s = skip ? Status() : inner_->allreduce(job.buf, job.count, job.dtype, job.op, job.wire);
    lock.lock();
    busy_ = false;
    if (!s.ok() && error_.ok()) error_ = s;
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace lowrank
