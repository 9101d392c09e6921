#include "transport/ucx/ucx_comm.h"

#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport/bootstrap/bootstrap.h"
#include "transport/ucx/eager.h"
#include "transport/ucx/tag.h"
#include "util/env.h"
#include "util/log.h"

namespace lowrank::ucx {
namespace {

constexpr int kSpinRounds = 64;        // progress calls before sleeping on the event fd
constexpr double kCloseWaitSec = 2.0;  // bound on flush / close / cancel waits in teardown
// After a peer's endpoint fails, how long a collective keeps progressing for data the peer sent
// before it went (it may still be queued) before reporting the failure.
constexpr double kFailureGraceSec = 0.25;
// What a failed endpoint means in the user's terms: UCX reports a killed peer as "Endpoint timeout"
// or "Connection reset by remote peer" within a fraction of a second, which reads like a slow peer.
// UCX's own words follow in parentheses.
constexpr const char* kPeerLost = "its process died or stopped responding, or the connection to it failed";

}  // namespace

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- UcxComm ------------------------------------------------------------------------------------

UcxComm::UcxComm(int rank, int nranks, double timeoutSec)
    : rank_(rank), size_(nranks), timeoutSec_(timeoutSec), peers_(new Peer[size_t(nranks)]) {
  for (int p = 0; p < nranks; ++p) {
    peers_[size_t(p)].comm = this;
    peers_[size_t(p)].rank = p;
  }
}

Status UcxComm::create(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                       const std::string& tls, std::unique_ptr<UcxComm>* out) {
  if (nranks < 1 || nranks > 65536 || rank < 0 || rank >= nranks)
    return Status::Error(lowrankInvalidArgument, "ucx: comm rank %d of %d out of range", rank, nranks);
  if (!(timeoutSec > 0))
    return Status::Error(lowrankInvalidArgument, "ucx: timeout %g s, must be > 0", timeoutSec);
  std::unique_ptr<UcxComm> c(new UcxComm(rank, nranks, timeoutSec));
  LR_RETURN_IF_ERROR(c->init(id, tls));
  LR_RETURN_IF_ERROR(c->handshake());
  *out = std::move(c);
  return Status::Ok();
}

namespace {
// A UCX configuration as UCX read it (environment, configuration files, defaults), in its printed
// form: one UCX_<name>=<value> a line.
std::string configText(ucp_config_t* cfg) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return "";
  ucp_config_print(cfg, f, nullptr, UCS_CONFIG_PRINT_CONFIG);
  fclose(f);
  const std::string all(text ? text : "", size);
  free(text);
  return all;
}

// The value of UCX_<name> in configText's form; "" if not found.
std::string configValue(const std::string& all, const char* name) {
  const std::string key = std::string("UCX_") + name + "=";
  for (size_t at = 0; at < all.size();) {
    const size_t end = std::min(all.find('\n', at), all.size());
    if (all.compare(at, key.size(), key) == 0) return all.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}
}  // namespace

Status UcxComm::init(const lowrankUniqueId& id, const std::string& tls) {
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return Status::Error(lowrankSystemError, "ucx: ucp_config_read: %s", ucs_status_string(st));
  if (!tls.empty() && (st = ucp_config_modify(cfg, "TLS", tls.c_str())) != UCS_OK) {
    ucp_config_release(cfg);
    return Status::Error(lowrankInvalidArgument, "ucx: TLS=%s: %s", tls.c_str(), ucs_status_string(st));
  }
  // Eager messages where the data can only travel over TCP (eager.h: UCX's rendezvous costs a
  // round trip and a slower path per message there). UCX's own values, from its environment and
  // its configuration files alike.
  const std::string config = configText(cfg);  // printed once: UCX's whole configuration
  const std::string tlsInForce = !tls.empty() ? tls : configValue(config, "TLS");
  // The user's threshold: any value in the environment (auto included), or one other than the
  // default in a configuration file.
  const char* envRndv = env::get("UCX_RNDV_THRESH");
  const std::string fileRndv = configValue(config, "RNDV_THRESH");
  const char* userRndv = envRndv ? envRndv : fileRndv != "auto" ? fileRndv.c_str() : nullptr;
  if (const char* rndv = rendezvousThreshold(userRndv, tlsInForce, hostHasRdmaDevice())) {
    if ((st = ucp_config_modify(cfg, "RNDV_THRESH", rndv)) != UCS_OK) {
      ucp_config_release(cfg);
      return Status::Error(lowrankSystemError, "ucx: RNDV_THRESH=%s: %s", rndv, ucs_status_string(st));
    }
    if (rank_ == 0)
      LR_INFO("ucx: the data travels over TCP only: messages eager (RNDV_THRESH=%s; "
              "UCX_RNDV_THRESH overrides)", rndv);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  if (st != UCS_OK) return Status::Error(lowrankSystemError, "ucx: ucp_init: %s", ucs_status_string(st));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return Status::Error(lowrankSystemError, "ucx: ucp_worker_create: %s", ucs_status_string(st));
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return Status::Error(lowrankSystemError, "ucx: ucp_worker_get_efd: %s", ucs_status_string(st));

  ucp_address_t* addr = nullptr;
  size_t addrLen = 0;
  st = ucp_worker_get_address(worker_, &addr, &addrLen);
  if (st != UCS_OK) return Status::Error(lowrankSystemError, "ucx: ucp_worker_get_address: %s", ucs_status_string(st));
  std::string blob(reinterpret_cast<const char*>(addr), addrLen);
  ucp_worker_release_address(worker_, addr);

  std::vector<std::string> all;
  LR_RETURN_IF_ERROR(bootstrap::allgatherBlobs(id, rank_, size_, blob, timeoutSec_, &all));

  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (all[size_t(p)].empty())
      return Status::Error(lowrankRemoteError, "ucx: comm rank %d sent an empty worker address", p);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(all[size_t(p)].data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxComm::onEndpointError;
    ep.err_handler.arg = &peers_[size_t(p)];
    st = ucp_ep_create(worker_, &ep, &peers_[size_t(p)].ep);
    if (st == UCS_ERR_UNREACHABLE)
      return Status::Error(lowrankSystemError, "ucx: comm rank %d: no UCX transport with peer-failure "
                           "support reaches comm rank %d (UCX 1.13's shared-memory transports have none; "
                           "UCX_TLS must include tcp or an RDMA transport)", rank_, p);
    if (st != UCS_OK)
      return Status::Error(lowrankSystemError, "ucx: comm rank %d: ucp_ep_create to comm rank %d: %s",
                           rank_, p, ucs_status_string(st));
  }
  LR_INFO("ucx: comm rank %d of %d: worker and %d endpoints ready", rank_, size_, size_ - 1);
  return Status::Ok();
}

Status UcxComm::handshake() {
  if (size_ == 1) return Status::Ok();
  // Each rank sends its comm rank to every peer (sequence 0, not counted) and checks what it gets.
  std::vector<uint64_t> got(size_t(size_), ~uint64_t(0));
  const uint64_t mine = uint64_t(rank_);
  Exchange ex(*this, 0, nullptr);
  Exchange::Handle h;
  for (int k = 1; k < size_; ++k) {
    int p = (rank_ + k) % size_;
    LR_RETURN_IF_ERROR(ex.recv(p, 0, &got[size_t(p)], sizeof(uint64_t), &h));
    LR_RETURN_IF_ERROR(ex.send(p, 0, &mine, sizeof mine, 1, &h));
  }
  LR_RETURN_IF_ERROR(ex.waitAll());
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && got[size_t(p)] != uint64_t(p))
      return Status::Error(lowrankInternalError, "ucx: handshake: comm rank %d got %llu from comm rank %d",
                           rank_, static_cast<unsigned long long>(got[size_t(p)]), p);
  return Status::Ok();
}

void UcxComm::onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->status.store(int(status), std::memory_order_relaxed);
  peer->failed.store(true, std::memory_order_release);
  LR_INFO("ucx: comm rank %d: endpoint to comm rank %d failed: %s", peer->comm->rank_, peer->rank,
          ucs_status_string(status));
}

const char* UcxComm::peerError(int peer) const {
  return ucs_status_string(ucs_status_t(peers_[size_t(peer)].status.load(std::memory_order_relaxed)));
}

void UcxComm::abort() {
  aborted_.store(true, std::memory_order_release);
  if (worker_) ucp_worker_signal(worker_);  // thread-safe in every thread mode
}

bool UcxComm::progressOrSleep(int maxSleepMs) {
  for (int i = 0; i < kSpinRounds; ++i)
    if (ucp_worker_progress(worker_)) return true;
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return true;  // events to process first
  if (st != UCS_OK) {                   // no wake-up possible: back off briefly
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return false;
  }
  if (aborted()) return false;  // abort() may have signalled before the arm
  pollfd p{efd_, POLLIN, 0};
  ::poll(&p, 1, maxSleepMs);
  return false;
}

void UcxComm::waitRequestBounded(void* req, double seconds) {
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  double end = steadySeconds() + seconds;
  while (ucp_request_check_status(req) == UCS_INPROGRESS && steadySeconds() < end) progressOrSleep(5);
  if (ucp_request_check_status(req) == UCS_INPROGRESS)
    LR_WARN("ucx: comm rank %d: a teardown request did not complete within %g s", rank_, seconds);
  ucp_request_free(req);
}

void UcxComm::closeEndpoints(bool flushFirst) {
  if (!worker_) return;
  if (flushFirst) {
    // Let what was sent reach the peers before the endpoints go (bounded: a peer may be gone).
    ucp_request_param_t fp{};
    waitRequestBounded(ucp_worker_flush_nbx(worker_, &fp), kCloseWaitSec);
  }
  std::vector<void*> reqs;
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[size_t(p)];
    if (!peer.ep) continue;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;  // never waits for a peer's acknowledgement
    void* r = ucp_ep_close_nbx(peer.ep, &cp);
    peer.ep = nullptr;
    if (r && !UCS_PTR_IS_ERR(r)) reqs.push_back(r);
  }
  for (void* r : reqs) waitRequestBounded(r, kCloseWaitSec);
}

void UcxComm::forceCloseEndpoints() { closeEndpoints(false); }

UcxComm::~UcxComm() {
  closeEndpoints(!failed() && !aborted());
  if (worker_) {
    // Drain what the closes left (e.g. keepalive), then destroy.
    for (int i = 0; i < 16 && ucp_worker_progress(worker_); ++i) {}
    ucp_worker_destroy(worker_);
  }
  if (context_) ucp_cleanup(context_);
}

// ---- Exchange -----------------------------------------------------------------------------------

Exchange::Exchange(UcxComm& comm, uint32_t seq, TransportCounters* counters)
    : comm_(comm), seq_(seq), counters_(counters) {
  resetDeadline();
}

void Exchange::resetDeadline() { deadline_ = steadySeconds() + comm_.timeoutSec(); }

Status Exchange::fail(Status st) {
  comm_.markFailed();
  return st;
}

void Exchange::setWire(const Wire& wire, float* base, size_t count) {
  wire_ = wire;
  wireBase_ = base;
  wireCount_ = count;
}

bool Exchange::offsetOf(const void* p, size_t* at) const {
  const auto* b = reinterpret_cast<const std::byte*>(wireBase_);
  const auto* q = static_cast<const std::byte*>(p);
  if (!wire_.active() || q < b || q >= b + 4 * wireCount_) return false;
  *at = size_t(q - b) / 4;
  return true;
}

Status Exchange::send(int peer, uint32_t index, const void* buf, size_t bytes, size_t elems, Handle* h) {
  std::vector<std::byte> staging;
  size_t at;
  if (bytes > 0 && offsetOf(buf, &at) && wire_.encodedIn(at, bytes / 4)) {
    // a 16-bit part: encode, and round the sender's own copy alike
    const size_t n = bytes / 4;
    staging.resize(wire_.bytes(at, n));
    wire::encode(wire_, at, n, const_cast<float*>(static_cast<const float*>(buf)), staging.data());
    buf = staging.data();
    bytes = staging.size();
  }
  if (comm_.peerFailed(peer))
    return fail(Status::Error(lowrankRemoteError, "ucx: collective #%u: comm rank %d disconnected before "
                              "comm rank %d sent to it (%s; UCX: %s)", seq_, peer, comm_.rank(),
                              kPeerLost, comm_.peerError(peer)));
  ucp_request_param_t p{};
  void* r = ucp_tag_send_nbx(comm_.ep(peer), buf, bytes, makeTag(comm_.rank(), seq_, index), &p);
  if (UCS_PTR_IS_ERR(r) && comm_.peerFailed(peer))
    return fail(Status::Error(lowrankRemoteError, "ucx: collective #%u: comm rank %d disconnected when "
                              "comm rank %d sent to it (%s; UCX: %s)", seq_, peer, comm_.rank(),
                              kPeerLost, ucs_status_string(UCS_PTR_STATUS(r))));
  if (UCS_PTR_IS_ERR(r))
    return fail(Status::Error(lowrankSystemError, "ucx: collective #%u: send to comm rank %d: %s", seq_,
                              peer, ucs_status_string(UCS_PTR_STATUS(r))));
  if (counters_) {
    counters_->elementsSent.fetch_add(elems, std::memory_order_relaxed);
    counters_->bytesSent.fetch_add(bytes, std::memory_order_relaxed);
    counters_->messages.fetch_add(1, std::memory_order_relaxed);
  }
  *h = ops_.size();
  LR_TRACE("ucx: comm rank %d: #%u send %zu bytes to %d, message %u, tag %llx%s", comm_.rank(), seq_, bytes,
           peer, index, (unsigned long long)makeTag(comm_.rank(), seq_, index), r ? "" : " (done)");
  ops_.push_back(Op{r, peer, false, r == nullptr, bytes, index, std::move(staging)});
  if (r) ++outstanding_;
  return Status::Ok();
}

Status Exchange::recv(int peer, uint32_t index, void* buf, size_t bytes, Handle* h, size_t at) {
  std::vector<std::byte> staging;
  float* dst = nullptr;
  const size_t n = bytes / 4;
  if (bytes > 0 && wire_.active() && (at != kAtDst || offsetOf(buf, &at)) && wire_.encodedIn(at, n)) {
    dst = static_cast<float*>(buf);
    staging.resize(wire_.bytes(at, n));
    buf = staging.data();
    bytes = staging.size();
  }
  // Always a request (no immediate completion): UCX 1.13 does not report the received length of an
  // immediately completed receive, and the length is checked (test()).
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* r = ucp_tag_recv_nbx(comm_.worker(), buf, bytes, makeTag(peer, seq_, index), kTagMaskFull, &p);
  if (UCS_PTR_IS_ERR(r) || r == nullptr)
    return fail(Status::Error(lowrankSystemError, "ucx: collective #%u: receive from comm rank %d: %s",
                              seq_, peer, r ? ucs_status_string(UCS_PTR_STATUS(r)) : "no request"));
  *h = ops_.size();
  LR_TRACE("ucx: comm rank %d: #%u recv %zu bytes from %d, message %u, tag %llx%s", comm_.rank(), seq_, bytes,
           peer, index, (unsigned long long)makeTag(peer, seq_, index), r ? "" : " (done)");
  ops_.push_back(Op{r, peer, true, r == nullptr, bytes, index, std::move(staging), dst, at, n});
  if (r) ++outstanding_;
  return Status::Ok();
}

Status Exchange::test(Handle h, bool* done) {
  Op& op = ops_[h];
  *done = op.done;
  if (op.done) return Status::Ok();
  ucs_status_t st;
  size_t len = op.bytes;
  if (op.recv) {
    ucp_tag_recv_info_t info{};
    st = ucp_tag_recv_request_test(op.req, &info);
    len = info.length;
  } else {
    st = ucp_request_check_status(op.req);
  }
  if (st == UCS_INPROGRESS) return Status::Ok();
  ucp_request_free(op.req);
  op.req = nullptr;
  op.done = true;
  --outstanding_;
  resetDeadline();
  LR_TRACE("ucx: comm rank %d: #%u %s %d message %u completed: %s, %zu bytes", comm_.rank(), seq_,
           op.recv ? "recv from" : "send to", op.peer, op.index, ucs_status_string(st), len);
  if (st != UCS_OK) {
    bool lost = comm_.peerFailed(op.peer) || st == UCS_ERR_CONNECTION_RESET ||
                st == UCS_ERR_ENDPOINT_TIMEOUT || st == UCS_ERR_UNREACHABLE;
    bool remote = lost || st == UCS_ERR_CANCELED;
    if (lost && st != UCS_ERR_MESSAGE_TRUNCATED)
      return fail(Status::Error(lowrankRemoteError, "ucx: collective #%u: comm rank %d disconnected "
                                "during the %s message %u (%s; UCX: %s)", seq_, op.peer,
                                op.recv ? "receive of" : "send of", op.index, kPeerLost,
                                ucs_status_string(st)));
    return fail(Status::Error(st == UCS_ERR_MESSAGE_TRUNCATED ? lowrankInvalidUsage
                              : remote                         ? lowrankRemoteError
                                                               : lowrankSystemError,
                              "ucx: collective #%u: %s comm rank %d (message %u) failed: %s%s", seq_,
                              op.recv ? "receive from" : "send to", op.peer, op.index,
                              ucs_status_string(st),
                              st == UCS_ERR_MESSAGE_TRUNCATED ? " (counts or dtypes differ across comm ranks?)" : ""));
  }
  if (op.recv && len != op.bytes)
    return fail(Status::Error(lowrankInvalidUsage, "ucx: collective #%u: comm rank %d sent %zu bytes, "
                              "expected %zu (do the ranks call with the same count, dtype and factor "
                              "dtype?)", seq_, op.peer, len, op.bytes));
  if (op.dst) {  // a 16-bit part: into float32 where the algorithm expects it
    wire::decode(wire_, op.at, op.elems, op.staging.data(), op.dst);
    std::vector<std::byte>().swap(op.staging);
  }
  *done = true;
  return Status::Ok();
}

Status Exchange::progress() {
  if (comm_.aborted())
    return fail(Status::Error(lowrankRemoteError, "ucx: collective #%u on comm rank %d: aborted", seq_,
                              comm_.rank()));
  // Only a failed peer this collective still waits on is an error: a peer that finished and left
  // after sending everything is not. And what such a peer sent just before leaving may still sit in
  // a transport's queue when its endpoint error is reported: keep progressing for a short grace
  // period before giving up on it.
  while (firstOpen_ < ops_.size() && ops_[firstOpen_].done) ++firstOpen_;
  const Op* oldest = nullptr;
  const Op* failedOp = nullptr;
  for (size_t i = firstOpen_; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.done) continue;
    if (!oldest) oldest = &op;
    if (comm_.peerFailed(op.peer)) {
      failedOp = &op;
      break;
    }
  }
  double now = steadySeconds();
  if (failedOp) {
    if (failureSeen_ == 0) failureSeen_ = now;
    if (now - failureSeen_ >= kFailureGraceSec)
      return fail(Status::Error(lowrankRemoteError, "ucx: collective #%u: comm rank %d disconnected "
                                "while comm rank %d waited on it (%s; UCX: %s)", seq_, failedOp->peer,
                                comm_.rank(), kPeerLost, comm_.peerError(failedOp->peer)));
  }
  if (oldest && now >= deadline_)
    return fail(Status::Error(lowrankTimeout, "ucx: collective #%u: comm rank %d waited %g s for comm "
                              "rank %d (%s message %u, %zu operations outstanding)", seq_,
                              comm_.rank(), comm_.timeoutSec(), oldest->peer,
                              oldest->recv ? "receive of" : "send of", oldest->index, outstanding_));
  double left = std::min(deadline_ - now, failedOp ? 0.005 : 0.02);
  comm_.progressOrSleep(int(left * 1000) + 1);
  return Status::Ok();
}

Status Exchange::waitAll() {
  for (;;) {
    while (firstOpen_ < ops_.size()) {
      bool done = false;
      LR_RETURN_IF_ERROR(test(firstOpen_, &done));
      if (!done) break;
      ++firstOpen_;
    }
    if (firstOpen_ == ops_.size()) return Status::Ok();
    LR_RETURN_IF_ERROR(progress());
  }
}

Exchange::~Exchange() {
  if (outstanding_ == 0) return;
  // An error left operations behind: cancel receives, close the endpoints (cancels sends), and wait
  // (bounded) so that UCX no longer writes into the caller's buffers.
  comm_.markFailed();
  for (Op& op : ops_)
    if (op.req && op.recv) ucp_request_cancel(comm_.worker(), op.req);
  comm_.forceCloseEndpoints();
  double end = steadySeconds() + 2.0;
  for (Op& op : ops_) {
    if (!op.req) continue;
    while (ucp_request_check_status(op.req) == UCS_INPROGRESS && steadySeconds() < end)
      comm_.progressOrSleep(5);
    if (ucp_request_check_status(op.req) == UCS_INPROGRESS)
      LR_WARN("ucx: collective #%u: an operation could not be cancelled", seq_);
    ucp_request_free(op.req);
    op.req = nullptr;
  }
}

}  // namespace lowrank::ucx
