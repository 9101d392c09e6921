// Emulated streams, events and host work (runtime.h: queued, run when forced).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "host_work.h"
#include "runtime.h"
#include "sync_calls.h"

namespace emu {
namespace {

bool live(CUstream_st* s) {
  return !s->destroyed && std::find(streams().begin(), streams().end(), s) != streams().end();
}

// Synchronizing a stream that is being captured is an error that ends the capture.
cudaError_t refuseIfCapturing(CUstream_st* s) {
  if (s->capture == cudaStreamCaptureStatusNone) return cudaSuccess;
  s->capture = cudaStreamCaptureStatusInvalidated;
  return setError(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

int deviceOf(const CUstream_st* s) { return s && s->device >= 0 ? s->device : currentDevice(); }

int streamDevice(CUstream_st* s) { return deviceOf(stream(s)); }

// A GPU launches a kernel only on a stream of the current device, and a kernel that touches memory
// of another device (no peer access here) faults. The parameters are the launch's copies of the
// kernel's arguments: every aligned word that points into device memory is checked (a launch table
// is checked as the one pointer passed, not what it holds).
int checkKernelLaunch(CUstream_st* s, const void* params, size_t bytes) {
  const int dev = deviceOf(stream(s));
  if (dev != currentDevice()) {
    std::fprintf(stderr, "CUDA emulation: kernel launched on a stream of device %d while device %d "
                 "is current\n", dev, currentDevice());
    return setError(cudaErrorInvalidResourceHandle);
  }
  for (size_t at = 0; at + sizeof(uintptr_t) <= bytes; at += sizeof(uintptr_t)) {
    uintptr_t word;
    std::memcpy(&word, static_cast<const char*>(params) + at, sizeof word);
    const int owner = pointerDevice(reinterpret_cast<const void*>(word));
    if (owner >= 0 && owner != dev) {
      std::fprintf(stderr, "CUDA emulation: kernel launched on device %d is given memory of "
                   "device %d (%p)\n", dev, owner, reinterpret_cast<void*>(word));
      return setError(cudaErrorIllegalAddress);
    }
  }
  return cudaSuccess;
}

int enqueueHostWork(CUstream_st* s, const char* what, std::function<void()> work) {
  return enqueue(s, what, std::move(work));
}

int enqueueGatedHostWork(CUstream_st* s, const char* what, std::function<bool()> ready,
                         std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  OpPtr op;
  if (cudaError_t e = enqueue(s, what, std::move(work), nullptr, &op)) return e;
  if (!op) return cudaErrorStreamCaptureUnsupported;  // captured: a gate cannot be replayed
  op->gate = std::move(ready);
  return cudaSuccess;
}

}  // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (!s || (flags & ~unsigned(cudaStreamNonBlocking))) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  *s = new CUstream_st;
  (*s)->device = currentDevice();
  (*s)->blocking = !(flags & cudaStreamNonBlocking);
  streams().push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

// As CUDA's, returns at once: work still queued runs later, when something needs it (the stream
// stays in the scheduler's set, its handle no longer usable); an empty stream goes now.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (!s || !live(s)) return setError(cudaErrorInvalidResourceHandle);
  if (!s->queue.empty()) {
    s->destroyed = true;
    return cudaSuccess;
  }
  streams().erase(std::find(streams().begin(), streams().end(), s));
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  countSync("cudaStreamSynchronize");
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (cudaError_t e = refuseIfCapturing(stream(s))) return e;
  if (cudaError_t e = checkUnsafeDuringCapture(false)) return setError(e);
  if (!s) return setError(syncLegacy());
  complete(s->tail);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (cudaError_t e = refuseIfCapturing(stream(s))) return e;
  if (cudaError_t e = checkUnsafeDuringCapture(false)) return setError(e);
  return poll(stream(s)->tail) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize() {
  countSync("cudaDeviceSynchronize");
  if (cudaError_t e = checkUnsafeDuringCapture(false)) return setError(e);
  syncDevice();
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (!fn) return setError(cudaErrorInvalidValue);
  return setError(enqueue(s, "cudaLaunchHostFunc", [fn, data] { fn(data); }));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (!e || (flags & ~unsigned(cudaEventDisableTiming))) return setError(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->device = currentDevice();
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (deviceOf(stream(s)) != e->device) {  // CUDA: the event and the stream of one device
    std::fprintf(stderr, "CUDA emulation: cudaEventRecord of an event of device %d on a stream of "
                 "device %d\n", e->device, deviceOf(stream(s)));
    return setError(cudaErrorInvalidResourceHandle);
  }
  OpPtr marker;
  if (cudaError_t err = enqueue(s, "cudaEventRecord", {}, nullptr, &marker)) return setError(err);
  e->marker = marker;
  return cudaSuccess;
}

// The wait is an operation of s that cannot run before the event's record has.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (!e || flags) return setError(!e ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (!e->marker) return cudaSuccess;  // never recorded: nothing to wait for, as in CUDA
  return setError(enqueue(s, "cudaStreamWaitEvent", {}, e->marker));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  countSync("cudaEventSynchronize");
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = checkUnsafeDuringCapture(false)) return setError(err);
  complete(e->marker);
  return cudaSuccess;
}

// A query is a potentially unsafe call during a capture (PyTorch's NCCL watchdog, polling its
// events, broke other threads' captures in global mode until it polled in relaxed mode).
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = checkUnsafeDuringCapture(false)) return setError(err);
  return poll(e->marker) ? cudaSuccess : cudaErrorNotReady;
}

// Host time at which each record ran: meaningless as GPU timing, but ordered.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return setError(cudaErrorInvalidValue);
  if (!a->timing || !b->timing) return setError(cudaErrorInvalidResourceHandle);
  if (!a->marker || !b->marker || !a->marker->done || !b->marker->done)
    return setError(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->marker->doneAt - a->marker->doneAt).count();
  return cudaSuccess;
}

}  // extern "C"
