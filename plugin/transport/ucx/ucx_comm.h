// The UCX state of one comm rank: a context (TAG | WAKEUP), a worker (thread mode SERIALIZED) and an
// endpoint to every peer (error handling mode PEER), plus the waiting policy. Exchange tracks the
// messages of one collective and turns every failure into a Status.
#pragma once
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "util/status.h"

namespace lowrank::ucx {

class UcxComm {
 public:
  // Collective over the nranks comm ranks of `id`: makes the context and worker, exchanges worker
  // addresses through the bootstrap, connects to every peer and runs a handshake with each (so that
  // every endpoint is wired up when it returns). `tls`, if not empty, overrides UCX_TLS.
  static Status create(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                       const std::string& tls, std::unique_ptr<UcxComm>* out);
  ~UcxComm();  // flushes (bounded), force-closes the endpoints, destroys worker and context

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeoutSec() const { return timeoutSec_; }
  ucp_worker_h worker() const { return worker_; }
  ucp_ep_h ep(int peer) const { return peers_[size_t(peer)].ep; }

  bool peerFailed(int peer) const { return peers_[size_t(peer)].failed.load(std::memory_order_acquire); }
  const char* peerError(int peer) const;

  // Any thread, any time: sets the abort flag and wakes the worker's waiter.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Some collective failed on this comm (its endpoints may be force-closed, a peer may be gone):
  // teardown then closes the endpoints without flushing. Only the UCX layer's own state: whether
  // the transport is broken, and why, is Transport's record (transport.h), which refuses later
  // calls.
  void markFailed() { failed_.store(true, std::memory_order_release); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // One round of waiting: spins on progress, then arms the worker and sleeps on its event fd for at
  // most maxSleepMs. Returns true if progress was made.
  bool progressOrSleep(int maxSleepMs);
  // Closes every endpoint without waiting for peers (after a failure); requests on them complete
  // with UCS_ERR_CANCELED.
  void forceCloseEndpoints();

 private:
  struct Peer {
    UcxComm* comm = nullptr;
    int rank = 0;
    ucp_ep_h ep = nullptr;
    std::atomic<bool> failed{false};
    std::atomic<int> status{0};  // ucs_status_t of the failure
  };
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  UcxComm(int rank, int nranks, double timeoutSec);
  Status init(const lowrankUniqueId& id, const std::string& tls);
  Status handshake();
  // Progresses until `req` (a UCX request or status pointer) completes or `seconds` pass; frees it.
  void waitRequestBounded(void* req, double seconds);
  void closeEndpoints(bool flushFirst);

  int rank_, size_;
  double timeoutSec_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::unique_ptr<Peer[]> peers_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};
};

// The messages of one collective: posts tagged sends/receives, tests and waits for them with
// abort, peer failure and an inactivity deadline (timeoutSec without any completion) checked every
// round. Every error it returns also marks the comm failed (UcxComm::markFailed). The destructor
// cancels whatever is still outstanding (after an error) and waits, bounded, for UCX to let go of
// the buffers.
class Exchange {
 public:
  using Handle = size_t;
  // counters: where sends are counted (null: not counted, e.g. the handshake).
  Exchange(UcxComm& comm, uint32_t seq, TransportCounters* counters);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // A collective with a 16-bit part (wire.h) over the float32 buffer `base` of `count` elements:
  // from here on, a send from inside base encodes its elements (rounding them in place there) and
  // a receive of elements [at, at + n) of the buffer (wherever it lands) is decoded on completion;
  // `bytes` stay those of float32 elements, the wire's are computed here.
  void setWire(const Wire& wire, float* base, size_t count);

  // elems: counted in counters->elementsSent.
  Status send(int peer, uint32_t index, const void* buf, size_t bytes, size_t elems, Handle* h);
  // at: with a wire, the first element of the buffer this message carries (kAtDst: buf is inside
  // the buffer, at its own offset).
  static constexpr size_t kAtDst = ~size_t(0);
  Status recv(int peer, uint32_t index, void* buf, size_t bytes, Handle* h, size_t at = kAtDst);
  // *done = the operation has completed successfully; an error if it completed with one.
  Status test(Handle h, bool* done);
  Status waitAll();
  // One round of waiting, after checking the abort flag, failed peers this collective still waits
  // on, and the deadline.
  Status progress();

 private:
  struct Op {
    void* req = nullptr;  // UCX request, null once completed and freed
    int peer = 0;
    bool recv = false;
    bool done = false;
    size_t bytes = 0;
    uint32_t index = 0;
    // with a wire: the encoded message (sends: kept until done; receives: decoded into dst)
    std::vector<std::byte> staging;
    float* dst = nullptr;
    size_t at = 0, elems = 0;
  };
  // The element of the wire's buffer at p (p inside it); false outside.
  bool offsetOf(const void* p, size_t* at) const;
  Status fail(Status st);
  void resetDeadline();

  UcxComm& comm_;
  uint32_t seq_;
  TransportCounters* counters_;
  std::vector<Op> ops_;
  Wire wire_;
  float* wireBase_ = nullptr;
  size_t wireCount_ = 0;
  size_t outstanding_ = 0;
  size_t firstOpen_ = 0;  // ops_ before this index are all done
  double deadline_ = 0;   // steady seconds
  double failureSeen_ = 0;  // when a failed peer with outstanding operations was first seen
};

double steadySeconds();

}  // namespace lowrank::ucx
