// The emulated runtime's count of synchronizing calls (issue 39): calls that CUDA's runtime
// documents as synchronizing the host with the device or with other streams ("API
// synchronization behavior", "Implicit synchronization"), counted by kind and calling thread, so
// that a test can hold that lowrank makes none on the training path (a worker thread's calls).
// Kinds: "cudaMalloc", "cudaMallocHost", "cudaFree", "cudaFreeHost", "cudaMemcpy" and
// "cudaMemset" (the synchronous forms), "legacy stream" (any work queued on the legacy default
// stream, which every blocking stream waits for and PyTorch's default stream is),
// "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize". Stream-ordered
// allocation (cudaMallocAsync, cudaFreeAsync), copies queued on a non-blocking stream and polls
// (cudaEventQuery, cudaStreamQuery) are not counted.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

namespace emu {

using SyncCalls = std::map<std::pair<std::string, std::thread::id>, uint64_t>;

// Clears the counts.
void syncCallsReset();
// The counts since the last reset, by (kind, thread).
SyncCalls syncCalls();
// Counts one call of `kind` on the calling thread (the emulated runtime's own entry points).
void countSync(const char* kind);

}  // namespace emu
