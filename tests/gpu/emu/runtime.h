// Internals of the emulated CUDA runtime (libcuda.so.1 of tests/gpu/emu).
//
// The device as a set of queues: every stream is a FIFO of operations (kernels, copies, memsets,
// host work such as the NCCL test double's collectives, event records and waits). Nothing runs
// when it is queued. Work runs when the host needs it to have run: a stream, event or device
// synchronize, a synchronous copy or memset, a cudaFree. Then only what that target depends on
// runs (its stream's earlier work, and what that work waits for through events or the legacy
// default stream's implicit ordering), and among the operations that are ready at each step the
// scheduler takes the one issued last (LOWRANK_EMU_SEED=0, the default), inverting the host's
// issue order wherever no dependency forbids it, so that a missing event wait or a kernel on the
// wrong stream shows as a wrong result instead of passing by luck; any other seed picks among the
// ready operations at random. A poll (cudaStreamQuery, cudaEventQuery) lets the device take one
// step, as time would. Single-threaded, as the kernels' fibers are (emu.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime_api.h"

namespace emu {

struct Op;
using OpPtr = std::shared_ptr<Op>;

struct Op {
  uint64_t seq = 0;                 // issue order over all streams
  std::string what;                 // for the emulation's messages
  std::function<void()> run;        // empty for event records and waits
  std::function<bool()> gate;       // if set, the operation cannot run while it returns false
  OpPtr prev;                       // the stream's previous operation (cleared once run)
  std::vector<OpPtr> after;         // other operations that must run first (cleared once run)
  bool needed = false, done = false;
  std::chrono::steady_clock::time_point doneAt;
};

struct Node {  // one operation of a captured graph
  std::string what;
  std::function<void()> run;
};

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// The one lock of the device state (recursive: queued host work may query pointers).
std::recursive_mutex& deviceMutex();

// Records e as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t setError(cudaError_t e);

// Two devices, 0 and 1 (cudaGetDeviceCount), one current per thread (cudaSetDevice; 0 at first).
// They share the host's memory and one scheduler; what ties work to a device is checked instead:
// a kernel, an event record or a collective on a stream of a device that is not current, or a
// kernel given memory of another device, is an error (as on GPUs without peer access).
constexpr int kDevices = 2;
int currentDevice();
// The device whose work s carries: its own, or the current device's for the legacy stream.
int deviceOf(const CUstream_st* s);

}  // namespace emu

struct CUstream_st {
  int device = -1;       // the device current when it was made; -1: the legacy stream (any device's)
  bool blocking = true;  // ordered with the legacy default stream (not cudaStreamNonBlocking)
  bool legacy = false;
  bool destroyed = false;        // cudaStreamDestroy'd with work queued: runs it, takes no more
  std::deque<emu::OpPtr> queue;  // queued, not yet run, in issue order
  emu::OpPtr tail;               // the last operation queued (run or not)
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamCaptureMode captureMode = cudaStreamCaptureModeGlobal;
  std::thread::id captureThread;  // the thread that began the capture
  std::vector<emu::Node> captured;
};

struct CUevent_st {
  int device = 0;     // the device current when it was made
  emu::OpPtr marker;  // the last record (null: never recorded)
  bool timing = true;
};

namespace emu {

// The stream a handle names (null: the legacy default stream).
CUstream_st* stream(cudaStream_t s);
std::vector<CUstream_st*>& streams();  // every live stream, the legacy one first

// Queues an operation on s (captured instead while s is being captured); waitFor, if not null,
// must run first. *out, if given, receives the operation (null when captured).
cudaError_t enqueue(cudaStream_t s, std::string what, std::function<void()> run,
                    const OpPtr& waitFor = nullptr, OpPtr* out = nullptr);
// Runs what `target` needs, then target. Never returns with target pending: work held by a closed
// gate (enqueueGatedHostWork) is waited for, as CUDA's synchronous calls wait for a kernel that
// never ends, but not past 30 s (LOWRANK_EMU_UNBOUNDED_WAIT_S): then the emulation aborts naming
// the unbounded wait.
void complete(const OpPtr& target);
// One step towards target (a poll): true once target has run.
bool poll(const OpPtr& target);
// Queues a marker on the legacy default stream and completes it: what a synchronous call waits
// for. Fails (as CUDA does) while a blocking stream is being captured.
cudaError_t syncLegacy();
void syncDevice();

// Capture (capture.cc): adds an operation to s's graph instead of its queue; for markers (event
// records and waits) in a capture, which the emulation does not model, the capture is invalidated.
cudaError_t captureAppend(CUstream_st* s, std::string what, std::function<void()> run);
// A call that CUDA forbids during a capture ("potentially unsafe": it may synchronize, such as an
// allocation, a free, a synchronous copy, a synchronize or a query), or work on the legacy stream
// (legacyStreamWork: it would order the legacy stream after a capturing blocking stream).
// An unsafe call made by a thread in relaxed mode (cudaThreadExchangeStreamCaptureMode) breaks no
// capture; else it breaks the calling thread's own captures that are not relaxed, and, when the
// thread is in global mode, other threads' captures in global mode (CUDA's rule for
// cudaStreamCaptureModeGlobal, ThreadLocal and Relaxed). Legacy-stream work breaks every capture
// of a blocking stream that is not relaxed. Invalidates those captures and returns the error CUDA
// returns, else cudaSuccess.
cudaError_t checkUnsafeDuringCapture(bool legacyStreamWork);

}  // namespace emu
