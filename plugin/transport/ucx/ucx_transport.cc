// UcxTransport: argument checks, the failed/aborted state, the sequence number and the choice of
// algorithm; the messages are in ucx_comm.cc, the algorithms in direct.cc and ring.cc.
#include "transport/ucx/ucx_transport.h"

#include <cstdint>
#include <vector>

#include "transport/reduce.h"
#include "transport/ucx/algorithms.h"
#include "transport/ucx/ucx_comm.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::unique_ptr<ucx::UcxComm> comm, const UcxTransportOptions& opt)
      : comm_(std::move(comm)), opt_(opt) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void abort() override { comm_->abort(); }
  bool broken() const override { return comm_->failed() || comm_->aborted(); }

  Status allreduce(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) override {
    if (!transport::reductionValid(dtype, op))
      return Status::Error(lowrankInvalidArgument, "ucx allreduce: invalid dtype %d or op %d", int(dtype),
                           int(op));
    const size_t es = dtypeSize(dtype);
    if (count > 0 && !buf) return Status::Error(lowrankInvalidArgument, "ucx allreduce: null buffer");
    if (count > SIZE_MAX / es)
      return Status::Error(lowrankInvalidArgument, "ucx allreduce: count %zu overflows", count);
    if (comm_->aborted())
      return Status::Error(lowrankInvalidUsage, "ucx allreduce: the communicator was aborted");
    if (comm_->failed())
      return Status::Error(lowrankInvalidUsage,
                           "ucx allreduce: the communicator failed at an earlier collective (%s); "
                           "destroy it", comm_->failure().c_str());
    const uint32_t seq = ++seq_;  // every call, count 0 included, so ranks stay in step
    const int n = comm_->size();
    if (count == 0 || n == 1) return Status::Ok();  // avg over one rank is the identity
    const ucx::AllreduceArgs a{buf, count, dtype, op, es};
    // Direct sends (N-1) x the buffer in one step, the ring 2(N-1)/N x in 2(N-1) steps: direct
    // only while what it sends stays small, so slow links are not charged for its latency gain.
    const bool direct = count * es * size_t(n - 1) <= opt_.directMaxBytes && n <= opt_.directMaxRanks;
    LR_TRACE("ucx: comm rank %d: allreduce #%u of %zu %s (%s), %s", comm_->rank(), seq, count,
             dtypeName(dtype), opName(op), direct ? "direct" : "ring");
    ucx::Exchange ex(*comm_, seq, &counters_);
    Status st = direct ? ucx::directAllreduce(ex, a, &scratch_)
                       : ucx::ringAllreduce(ex, a, opt_.chunkBytes, opt_.inflight, &scratch_);
    if (!st.ok()) comm_->markFailed(st);
    return st;
  }

 private:
  std::unique_ptr<ucx::UcxComm> comm_;
  UcxTransportOptions opt_;
  uint32_t seq_ = 0;
  std::vector<std::byte> scratch_;
};

}  // namespace

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          const UcxTransportOptions& options, std::unique_ptr<Transport>* out) {
  if (!out) return Status::Error(lowrankInvalidArgument, "createUcxTransport: null output");
  if (options.chunkBytes == 0 || options.inflight < 1)
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: chunkBytes and inflight must be > 0");
  std::unique_ptr<ucx::UcxComm> comm;
  LR_RETURN_IF_ERROR(ucx::UcxComm::create(id, rank, nranks, timeoutSec, options.tls, &comm));
  *out = std::make_unique<UcxTransport>(std::move(comm), options);
  return Status::Ok();
}

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          std::unique_ptr<Transport>* out) {
  return createUcxTransport(id, rank, nranks, timeoutSec, UcxTransportOptions{}, out);
}

}  // namespace lowrank
