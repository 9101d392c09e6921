// UcxTransport: the sequence number and the choice of algorithm (argument checks and the failure
// record are Transport's); the messages are in ucx_comm.cc, the algorithms in direct.cc, ring.cc,
// recursive_doubling.cc and halving_doubling.cc, their costs in cost_model.cc.
#include "transport/ucx/ucx_transport.h"

#include <cstdint>
#include <vector>

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
  const char* name() const override { return "ucx"; }

 private:
  void onAbort() override { comm_->abort(); }  // a waiting exchange returns promptly

  Status run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) override {
    const uint32_t seq = ++seq_;  // every call, count 0 included, so ranks stay in step
    const int n = comm_->size();
    if (count == 0 || n == 1) return Status::Ok();  // avg over one rank is the identity
    const size_t es = dtypeSize(dtype);
    const ucx::AllreduceArgs a{buf, count, dtype, op, es};
    // Every comm rank computes the same choice from the same arguments and options.
    const double bytes = double(count * es);
    const ucx::Algorithm algo =
        opt_.algorithm ? *opt_.algorithm : ucx::choose(n, bytes, opt_.cost, opt_.directMaxRanks);
    LR_TRACE("ucx: comm rank %d: allreduce #%u of %zu %s (%s), %s%s, modelled %.1f us", comm_->rank(),
             seq, count, dtypeName(dtype), opName(op), ucx::algorithmName(algo),
             opt_.algorithm ? " (LOWRANK_UCX_ALGO)" : "",
             1e6 * ucx::modelledSeconds(algo, n, bytes, opt_.cost));
    ucx::Exchange ex(*comm_, seq, &counters_);
    Status st;
    switch (algo) {
      case ucx::Algorithm::Direct: st = ucx::directAllreduce(ex, a, &scratch_); break;
      case ucx::Algorithm::RecursiveDoubling: st = ucx::recursiveDoublingAllreduce(ex, a, &scratch_); break;
      case ucx::Algorithm::HalvingDoubling:
        st = ucx::halvingDoublingAllreduce(ex, a, opt_.chunkBytes, opt_.inflight, &scratch_);
        break;
      case ucx::Algorithm::Ring:
        st = ucx::ringAllreduce(ex, a, opt_.chunkBytes, opt_.inflight, &scratch_);
        break;
    }
    if (!st.ok()) comm_->markFailed();  // teardown then skips the flush (ucx_comm.h)
    return st;
  }

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
  if (!(options.cost.alphaSec > 0) || !(options.cost.betaSecPerByte > 0))
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: alpha and beta must be > 0");
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
