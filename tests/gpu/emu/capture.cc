// Emulated stream capture and graphs, as far as lowrank uses them: one stream's work captured in
// order (kernels, copies, memsets, host work such as NCCL's collectives) and replayed by
// cudaGraphLaunch. Event records and waits inside a capture (fork/join of several streams) are not
// emulated: they invalidate the capture, so a test that needs them fails instead of passing.
#include <utility>

#include "runtime.h"

struct CUgraph_st {
  std::vector<emu::Node> nodes;
};
struct CUgraphExec_st {
  std::vector<emu::Node> nodes;
};

namespace emu {

cudaError_t captureAppend(CUstream_st* s, std::string what, std::function<void()> run) {
  if (s->capture == cudaStreamCaptureStatusInvalidated) return cudaErrorStreamCaptureInvalidated;
  if (!run) {
    s->capture = cudaStreamCaptureStatusInvalidated;
    return cudaErrorStreamCaptureUnsupported;
  }
  s->captured.push_back(Node{std::move(what), std::move(run)});
  return cudaSuccess;
}

namespace {
thread_local cudaStreamCaptureMode threadMode = cudaStreamCaptureModeGlobal;
}  // namespace

cudaError_t checkUnsafeDuringCapture(bool legacyStreamWork) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  cudaError_t e = cudaSuccess;
  const std::thread::id me = std::this_thread::get_id();
  for (CUstream_st* s : streams()) {
    if (s->capture != cudaStreamCaptureStatusActive || s->captureMode == cudaStreamCaptureModeRelaxed)
      continue;
    if (legacyStreamWork) {
      if (!s->blocking) continue;  // not ordered with the legacy stream
    } else {
      if (threadMode == cudaStreamCaptureModeRelaxed) continue;
      const bool own = s->captureThread == me;
      if (!own && !(threadMode == cudaStreamCaptureModeGlobal &&
                    s->captureMode == cudaStreamCaptureModeGlobal))
        continue;
    }
    s->capture = cudaStreamCaptureStatusInvalidated;
    e = legacyStreamWork ? cudaErrorStreamCaptureImplicit : cudaErrorStreamCaptureUnsupported;
  }
  return e;
}

}  // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (!s) return setError(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot be captured
  if (s->capture != cudaStreamCaptureStatusNone) return setError(cudaErrorIllegalState);
  s->capture = cudaStreamCaptureStatusActive;
  s->captureMode = mode;
  s->captureThread = std::this_thread::get_id();
  s->captured.clear();
  return cudaSuccess;
}

// The calling thread's mode for potentially unsafe calls (checkUnsafeDuringCapture): *mode is set,
// the old one returned in it.
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode || *mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed)
    return setError(cudaErrorInvalidValue);
  std::swap(*mode, threadMode);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (!status) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  *status = stream(s)->capture;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (!graph) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  *graph = nullptr;
  if (!s || s->capture == cudaStreamCaptureStatusNone) return setError(cudaErrorIllegalState);
  const bool invalidated = s->capture == cudaStreamCaptureStatusInvalidated;
  s->capture = cudaStreamCaptureStatusNone;
  std::vector<Node> nodes = std::move(s->captured);
  s->captured.clear();
  if (invalidated) return setError(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(nodes)};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!exec || !graph) return setError(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return setError(cudaErrorInvalidValue);
  for (const Node& n : exec->nodes)
    if (cudaError_t e = enqueue(s, n.what, n.run)) return setError(e);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
