// lowrank's own CUDA calls never break a CUDA graph capture (issue 39): PyTorch captures in global
// mode, in which a potentially unsafe call (an allocation, a free, a query, a synchronize) from
// any thread invalidates the capture, so a hook thread planning a buffer (or polling its events)
// while another thread captures would break that graph. Every entry of the backend runs with its
// thread's capture mode relaxed (cudaThreadExchangeStreamCaptureMode, as PyTorch's NCCL watchdog
// does) and restores the caller's mode on return. lowrank never captures its compressed calls
// (refused on a capturing stream) and queues no legacy-stream work (where the device has memory
// pools), so relaxed mode lets nothing of lowrank's into a graph.
#pragma once
#include <cuda_runtime_api.h>

namespace lowrank::cuda {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { set_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (set_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the caller's, once exchanged
  bool set_ = false;
};

}  // namespace lowrank::cuda
