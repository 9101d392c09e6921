// UcxTransport: the sequence number and the choice of algorithm (argument checks and the failure
// record are Transport's) and, with LOWRANK_UCX_ALGO=tune, the online tuning (tuner.h); the messages are in ucx_comm.cc, the algorithms in direct.cc, ring.cc,
// recursive_doubling.cc and halving_doubling.cc, their costs in cost_model.cc.
#include "transport/ucx/ucx_transport.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transport/ucx/algorithms.h"
#include "transport/ucx/tuner.h"
#include "transport/ucx/ucx_comm.h"
#include "util/dtype.h"
#include "util/log.h"

namespace lowrank {
namespace {

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::unique_ptr<ucx::UcxComm> comm, const UcxTransportOptions& opt)
      : comm_(std::move(comm)), opt_(opt) {
    if (opt_.tune && !opt_.algorithm)
      tuner_.emplace(comm_->size(), opt_.directMaxRanks, opt_.tuneRepeats);
  }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const char* name() const override { return "ucx"; }

  // The links measured and agreed (link_probe.h); the pinned constants kept. Collective.
  Status probe() {
    ucx::ProbeResult r;
    LR_RETURN_IF_ERROR(ucx::probeLinks(*comm_, &seq_, opt_.probeOptions, opt_.probeAdjust, &r));
    ucx::CostParams c = r.agreed;
    if (opt_.alphaPinned || !(c.alphaSec > 0)) c.alphaSec = opt_.cost.alphaSec;
    if (opt_.betaPinned || !(c.betaSecPerByte > 0)) c.betaSecPerByte = opt_.cost.betaSecPerByte;
    if (opt_.overheadPinned) c.overheadSec = opt_.cost.overheadSec;
    opt_.cost = c;
    LR_INFO("ucx: comm rank %d/%d: links measured in %.0f ms (pairs of comm ranks; here, with %d: "
            "alpha %.1f us, o %.2f us, beta %.4f ns/B); agreed, max over comm ranks: alpha %.1f us, "
            "o %.2f us, beta %.4f ns/B (%.1f Mbit/s); used: alpha %.1f us%s, o %.2f us%s, beta %.4f "
            "ns/B%s", comm_->rank(), comm_->size(), 1e3 * r.seconds, r.partner,
            1e6 * r.local.alphaSec, 1e6 * r.local.overheadSec, 1e9 * r.local.betaSecPerByte,
            1e6 * r.agreed.alphaSec, 1e6 * r.agreed.overheadSec, 1e9 * r.agreed.betaSecPerByte,
            r.agreed.betaSecPerByte > 0 ? 8e-6 / r.agreed.betaSecPerByte : 0.0, 1e6 * c.alphaSec,
            opt_.alphaPinned ? " (pinned)" : "", 1e6 * c.overheadSec,
            opt_.overheadPinned ? " (pinned)" : "", 1e9 * c.betaSecPerByte,
            opt_.betaPinned ? " (pinned)" : "");
    {
      std::lock_guard<std::mutex> lk(infoMutex_);
      probed_ = r;
    }
    if (opt_.onProbed) opt_.onProbed(r);
    return Status::Ok();
  }

  std::string info() const override {
    std::lock_guard<std::mutex> lk(infoMutex_);
    std::string s;
    char b[256];
    const char* source = opt_.algorithm ? "forced" : tuner_ ? "tuned" : probed_ ? "measured" : "given";
    snprintf(b, sizeof b,
             "{\"transport\": \"ucx\", \"choice\": \"%s\", \"alpha_us\": %.6g, \"overhead_us\": "
             "%.6g, \"beta_ns_per_byte\": %.6g",
             source, 1e6 * opt_.cost.alphaSec, 1e6 * opt_.cost.overheadSec,
             1e9 * opt_.cost.betaSecPerByte);
    s = b;
    if (probed_) {
      const ucx::ProbeResult& r = *probed_;
      snprintf(b, sizeof b,
               ", \"probe\": {\"partner\": %d, \"small_rtt_us\": %.6g, \"burst_us\": %.6g, "
               "\"large1_us\": %.6g, \"large2_us\": %.6g, \"small_rtt_alone_us\": %.6g, "
               "\"seconds\": %.6g}",
               r.partner, 1e6 * r.timings.smallRtt, 1e6 * r.timings.burst, 1e6 * r.timings.large1,
               1e6 * r.timings.large2, 1e6 * r.timings.smallRttAlone, r.seconds);
      s += b;
    }
    s += ", \"algorithms\": {";  // per size class seen: floor(log2(bytes)) -> algorithm
    bool first = true;
    for (int c = 0; c < int(used_.size()); ++c) {
      if (used_[size_t(c)] < 0) continue;
      snprintf(b, sizeof b, "%s\"%d\": \"%s\"", first ? "" : ", ", c,
               ucx::algorithmName(ucx::Algorithm(used_[size_t(c)])));
      s += b;
      first = false;
    }
    return s + "}}";
  }

 private:
  void onAbort() override { comm_->abort(); }  // a waiting exchange returns promptly

  Status run(void* buf, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op,
             const Wire& wire) override {
    const uint32_t seq = ++seq_;  // every call, count 0 included, so ranks stay in step
    const int n = comm_->size();
    if (count == 0 || n == 1) return Status::Ok();  // avg over one rank is the identity
    const size_t es = dtypeSize(dtype);
    const ucx::AllreduceArgs a{buf, count, dtype, op, es, wire};
    // Every comm rank computes the same choice from the same arguments, options and call sequence
    // (the tuner's trials follow the calls; its choice, timings agreed by all ranks: tuner.h).
    // With a 16-bit part the bytes are the wire's, and the choice keeps to the algorithms that
    // round each element a bounded number of times (cost_model.h: roundsBounded), by the model:
    // the tuner's size classes time float32 calls only.
    const double bytes = wire.active() ? double(wire.bytes(0, count)) : double(count * es);
    ucx::Algorithm algo;
    bool trial = false;
    if (opt_.algorithm) {
      algo = *opt_.algorithm;
    } else if (tuner_ && !wire.active()) {
      const ucx::Tuner::Plan p = tuner_->plan(bytes);
      algo = p.algo, trial = p.trial;
    } else {
      algo = ucx::choose(n, bytes, opt_.cost, opt_.directMaxRanks, wire.active());
    }
    LR_TRACE("ucx: comm rank %d: allreduce #%u of %zu %s (%s), %s%s, modelled %.1f us", comm_->rank(),
             seq, count, dtypeName(dtype), opName(op), ucx::algorithmName(algo),
             opt_.algorithm ? " (LOWRANK_UCX_ALGO)" : trial ? " (tuning trial)" : "",
             1e6 * ucx::modelledSeconds(algo, n, bytes, opt_.cost));
    if (!trial) {
      std::lock_guard<std::mutex> lk(infoMutex_);
      used_[size_t(ucx::Tuner::sizeClass(bytes))] = int(algo);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status st = runAlgorithm(algo, seq, a);
    if (st.ok() && trial) {
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (opt_.tuneTimer) sec = opt_.tuneTimer(algo, sec);
      if (tuner_->record(bytes, sec)) st = agree(bytes);
    }
    if (!st.ok()) comm_->markFailed();  // teardown then skips the flush (ucx_comm.h)
    return st;
  }

  Status runAlgorithm(ucx::Algorithm algo, uint32_t seq, const ucx::AllreduceArgs& a) {
    ucx::Exchange ex(*comm_, seq, &counters_);
    if (a.wire.active()) ex.setWire(a.wire, static_cast<float*>(a.buf), a.count);
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
      default: return Status::Error(lowrankInternalError, "ucx: unknown algorithm %d", int(algo));
    }
    return st;
  }

  // The tuning's agreement, after a size class's last trial (the same call on every comm rank):
  // the max over comm ranks of each candidate's median seconds, by one fixed algorithm, then the
  // argmin of those, frozen. Its messages are a collective of their own (a sequence number).
  Status agree(double bytes) {
    std::vector<double> t = tuner_->localTimings(bytes);
    const ucx::AllreduceArgs a{t.data(), t.size(), lowrankFloat64, lowrankMax, sizeof(double)};
    LR_RETURN_IF_ERROR(runAlgorithm(ucx::kAgreementAlgorithm, ++seq_, a));
    const ucx::TuneResult& r = tuner_->freeze(bytes, t);
    std::string line;
    char buf[96];
    for (size_t j = 0; j < r.candidates.size(); ++j) {
      snprintf(buf, sizeof buf, "%s%s %.1f us (here %.1f)", j ? ", " : "",
               ucx::algorithmName(r.candidates[j]), 1e6 * r.agreedSec[j], 1e6 * r.localSec[j]);
      line += buf;
    }
    LR_INFO("ucx: comm rank %d/%d: tuned allreduces of [2^%d, 2^%d) bytes: %s, after %d trials; "
            "median time per candidate, max over comm ranks: %s",
            comm_->rank(), comm_->size(), r.sizeClass, r.sizeClass + 1, ucx::algorithmName(r.choice),
            tuner_->trialsPerClass(), line.c_str());
    if (opt_.onTuned) opt_.onTuned(r);
    return Status::Ok();
  }

  std::unique_ptr<ucx::UcxComm> comm_;
  UcxTransportOptions opt_;
  uint32_t seq_ = 0;
  std::vector<std::byte> scratch_;
  std::optional<ucx::Tuner> tuner_;  // LOWRANK_UCX_ALGO=tune
  mutable std::mutex infoMutex_;       // info() reads from any thread what run() writes
  std::optional<ucx::ProbeResult> probed_;
  std::array<int, ucx::Tuner::kClasses> used_ = filled(-1);  // per size class: the last algorithm
  static std::array<int, ucx::Tuner::kClasses> filled(int v) {
    std::array<int, ucx::Tuner::kClasses> a;
    a.fill(v);
    return a;
  }
};

}  // namespace

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          const UcxTransportOptions& options, std::unique_ptr<Transport>* out) {
  if (!out) return Status::Error(lowrankInvalidArgument, "createUcxTransport: null output");
  if (options.chunkBytes == 0 || options.inflight < 1)
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: chunkBytes and inflight must be > 0");
  if (!(options.cost.alphaSec > 0) || !(options.cost.betaSecPerByte > 0))
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: alpha and beta must be > 0");
  if (options.tuneRepeats < 1)
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: tuneRepeats must be >= 1");
  if (options.probe && (options.probeOptions.burst < 2 || options.probeOptions.repeats < 1 ||
                        options.probeOptions.large2Bytes <= options.probeOptions.large1Bytes))
    return Status::Error(lowrankInvalidArgument, "createUcxTransport: bad probe options");
  std::unique_ptr<ucx::UcxComm> comm;
  LR_RETURN_IF_ERROR(ucx::UcxComm::create(id, rank, nranks, timeoutSec, options.tls, &comm));
  auto t = std::make_unique<UcxTransport>(std::move(comm), options);
  // only where the model chooses, and only if something is left to measure
  const bool all = options.alphaPinned && options.betaPinned && options.overheadPinned;
  if (options.probe && !options.algorithm && !options.tune && nranks > 1 && !all)
    LR_RETURN_IF_ERROR(t->probe());
  *out = std::move(t);
  return Status::Ok();
}

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          std::unique_ptr<Transport>* out) {
  return createUcxTransport(id, rank, nranks, timeoutSec, UcxTransportOptions{}, out);
}

}  // namespace lowrank
