#include "cuda_backend/device_wait.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace lowrank::cuda {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kNcclInProgress = 7;  // ncclInProgress: a non-blocking comm's call still queuing
constexpr double kAbortedGraceSec = 1.0;

cudaError_t query(cudaEvent_t ev, cudaStream_t stream) {
  return ev ? cudaEventQuery(ev) : cudaStreamQuery(stream);
}

void nap() { std::this_thread::sleep_for(std::chrono::microseconds(20)); }

// ncclCommGetAsyncError under ncclMu, which commAbort takes to set the flag before
// ncclCommAbort frees the comm: false, touching nothing, once the comm was aborted.
bool pollNccl(const DeviceComm& dc, int* result, int* async) {
  std::lock_guard<std::mutex> lock(dc.ncclMu);
  if (dc.aborted) return false;
  *result = dc.api->commGetAsyncError(dc.comm, async);
  return true;
}

}  // namespace

Err waitDevice(const DeviceComm& dc, cudaEvent_t ev, cudaStream_t stream, const char* phase) {
  const bool stuck = dc.stuck;  // an earlier wait timed out: the comm failed, waiting is over
  const auto deadline = Clock::now() + std::chrono::duration<double>(stuck ? 0.0 : dc.timeoutSec);
  auto aborted = [&] {
    return Err::Fail(lowrankRemoteError, "waiting for %s: the communicator was aborted", phase);
  };
  for (;;) {
    const cudaError_t q = query(ev, stream);
    // The flag is set before ncclCommAbort, which ends the collectives: done after it is no result.
    if (q == cudaSuccess) return dc.aborted ? aborted() : Err::Ok();
    if (q != cudaErrorNotReady)
      return Err::Fail(q == cudaErrorMemoryAllocation ? lowrankSystemError : lowrankUnhandledCudaError,
                       "waiting for %s: %s failed: %s (%s)", phase,
                       ev ? "cudaEventQuery" : "cudaStreamQuery", cudaGetErrorString(q),
                       cudaGetErrorName(q));
    int async = 0, r = 0;
    if (!pollNccl(dc, &r, &async)) return aborted();
    char what[160];
    if (r) {
      snprintf(what, sizeof what, "ncclCommGetAsyncError (waiting for %s)", phase);
      return fromNccl(r, what);
    }
    if (async != 0 && async != kNcclInProgress) {
      snprintf(what, sizeof what, "waiting for %s: NCCL's asynchronous error", phase);
      return fromNccl(async, what);
    }
    if (Clock::now() > deadline) {
      dc.stuck = true;
      if (stuck)
        return Err::Fail(lowrankTimeout, "waiting for %s: an earlier wait of the communicator "
                         "timed out", phase);
      return Err::Fail(lowrankTimeout, "waiting for %s: timed out after %g s (LOWRANK_TIMEOUT)",
                       phase, dc.timeoutSec);
    }
    nap();
  }
}

Err ncclIssue(const DeviceComm& dc, const char* what, const std::function<int()>& call) {
  auto aborted = [&] { return Err::Fail(lowrankRemoteError, "%s: the communicator was aborted", what); };
  int r = 0;
  {
    std::lock_guard<std::mutex> lock(dc.ncclMu);
    if (dc.aborted) return aborted();
    r = call();
  }
  struct Guarded {
    const DeviceComm* dc;
    bool aborted = false;
  } g{&dc};
  const int settled = lowrankNcclSettlePolled(r, dc.timeoutSec, [](void* ctx, int* async) {
    auto* g = static_cast<Guarded*>(ctx);
    int r = 0;
    if (pollNccl(*g->dc, &r, async)) return r;
    g->aborted = true;
    return 1;  // any failure: reported as the abort below
  }, &g);
  if (g.aborted) return aborted();
  return fromNccl(settled, what);
}

// Once aborted: the one deadline of every teardown wait, set by the first of them.
Clock::time_point abortDeadline(const DeviceComm& dc) {
  const int64_t mine = std::chrono::duration_cast<std::chrono::nanoseconds>(
      (Clock::now() + std::chrono::duration<double>(kAbortedGraceSec)).time_since_epoch()).count();
  int64_t set = 0;
  dc.abortDeadlineNs.compare_exchange_strong(set, mine);  // set: the earlier one, if any
  return Clock::time_point(std::chrono::nanoseconds(set ? set : mine));
}

bool settleDevice(const DeviceComm& dc, const std::function<bool()>& done) {
  // Once aborted, one deadline for all teardown waits (issue 39: a second per buffer made an
  // abort with 30 stuck buffers take 30 s); once a wait timed out, none.
  const auto deadline =
      dc.aborted ? abortDeadline(dc)
                 : Clock::now() + std::chrono::duration<double>(dc.stuck ? 0.0 : dc.timeoutSec);
  for (;;) {
    if (done()) return true;
    if (Clock::now() > deadline) {
      dc.stuck = true;
      return false;
    }
    nap();
  }
}

bool settleDevice(const DeviceComm& dc, cudaEvent_t ev, cudaStream_t stream) {
  return settleDevice(dc, [&] {
    // Once a wait failed, the communication stream too: cudaFree waits for the whole device, and
    // would hang behind a collective that never ends.
    const bool failed = dc.stuck || dc.aborted;
    const cudaError_t q = query(ev, stream);
    const cudaError_t c = failed && ev && dc.stream ? cudaStreamQuery(dc.stream) : cudaSuccess;
    return q != cudaErrorNotReady && c != cudaErrorNotReady;  // done, or the device failed
  });
}

}  // namespace lowrank::cuda
