// Emulated device memory: host memory that the emulation knows as device memory (the driver's
// pointer query says so, as liblowrank asks it), filled with 0xff bytes when allocated, so that
// reading what was never written gives NaN; and the copies and memsets, queued on streams.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "host_work.h"
#include "runtime.h"
#include "sync_calls.h"

namespace emu {
namespace {

enum class Kind { kDevice, kPinnedHost };
struct Allocation {
  size_t bytes;
  Kind kind;
  int device;  // device memory: the device it was allocated on; -1 for pinned host memory
};

std::mutex allocMutex;  // apart from deviceMutex: pointer queries come from any thread
std::map<uintptr_t, Allocation>& allocations() {
  static auto* m = new std::map<uintptr_t, Allocation>;  // never destroyed: queried until exit
  return *m;
}

// The allocation holding [p, p + bytes), if any.
std::optional<Allocation> find(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(allocMutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocations().upper_bound(a);
  if (it == allocations().begin()) return std::nullopt;
  --it;
  if (a + bytes > it->first + it->second.bytes) return std::nullopt;
  return it->second;
}

// failDeviceAllocations: how many device allocations succeed before every later one fails
// (-1: none fails).
std::atomic<long> allocationsLeft{-1};
bool outOfDeviceMemory() {
  long left = allocationsLeft.load();
  while (left > 0 && !allocationsLeft.compare_exchange_weak(left, left - 1)) {
  }
  return left == 0;
}

cudaError_t allocate(void** p, size_t bytes, Kind kind) {
  if (!p) return setError(cudaErrorInvalidValue);
  if (cudaError_t e = checkUnsafeDuringCapture(false)) return setError(e);
  if (kind == Kind::kDevice && outOfDeviceMemory()) return setError(cudaErrorMemoryAllocation);
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return setError(cudaErrorMemoryAllocation);
  std::memset(*p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(allocMutex);
  allocations()[reinterpret_cast<uintptr_t>(*p)] =
      Allocation{bytes ? bytes : 1, kind, kind == Kind::kDevice ? currentDevice() : -1};
  return cudaSuccess;
}

// As CUDA's, a free waits for the device: queued work may still use the memory.
cudaError_t release(void* p, Kind kind) {
  if (!p) return cudaSuccess;
  if (cudaError_t e = checkUnsafeDuringCapture(false)) return setError(e);
  syncDevice();
  {
    std::lock_guard<std::mutex> lock(allocMutex);
    auto it = allocations().find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations().end() || it->second.kind != kind) return setError(cudaErrorInvalidValue);
    allocations().erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

// Device memory touched by a copy or memset must lie inside one allocation, as on a GPU (where
// it would fault); host memory cannot be checked.
bool deviceRangeValid(const void* p, size_t bytes, bool mustBeDevice) {
  if (!mustBeDevice) return true;
  const std::optional<Allocation> a = find(p, bytes);
  return a && a->kind == Kind::kDevice;
}

bool rangesValid(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  const bool dstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool srcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  return deviceRangeValid(dst, n, dstDev) && deviceRangeValid(src, n, srcDev);
}

}  // namespace

void failDeviceAllocations(long after) { allocationsLeft = after; }

int pointerDevice(const void* p) {
  const std::optional<Allocation> a = find(p, 1);
  return a && a->kind == Kind::kDevice ? a->device : -1;
}

}  // namespace emu

using namespace emu;

extern "C" {

// The driver's pointer query (cuPointerGetAttribute, CU_POINTER_ATTRIBUTE_MEMORY_TYPE only):
// CU_MEMORYTYPE_DEVICE for cudaMalloc's memory, CU_MEMORYTYPE_HOST for cudaMallocHost's,
// CUDA_ERROR_INVALID_VALUE for memory the emulation did not allocate.
__attribute__((visibility("default"))) int cuPointerGetAttribute(void* data, int attribute,
                                                                 unsigned long long ptr) {
  constexpr int kMemoryType = 2, kInvalidValue = 1;
  constexpr unsigned kHost = 1, kDevice = 2;
  if (!data || attribute != kMemoryType) return kInvalidValue;
  const std::optional<Allocation> a = find(reinterpret_cast<const void*>(uintptr_t(ptr)), 1);
  if (!a) return kInvalidValue;
  *static_cast<unsigned*>(data) = a->kind == Kind::kDevice ? kDevice : kHost;
  return 0;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  countSync("cudaMalloc");
  return allocate(p, bytes, Kind::kDevice);
}
cudaError_t cudaFree(void* p) {
  countSync("cudaFree");
  return release(p, Kind::kDevice);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  countSync("cudaMallocHost");
  return allocate(p, bytes, Kind::kPinnedHost);
}
cudaError_t cudaFreeHost(void* p) {
  countSync("cudaFreeHost");
  return release(p, Kind::kPinnedHost);
}

// Stream-ordered: the memory is there at once (its bytes NaN, as cudaMalloc's) and used in the
// stream's order; the free is an operation of the stream, run when the stream gets to it (the
// memory stays while work queued before it may use it). Neither synchronizes anything.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s) {
  if (stream(s)->capture != cudaStreamCaptureStatusNone)
    return setError(cudaErrorStreamCaptureUnsupported);  // memory nodes are not emulated
  if (!p) return setError(cudaErrorInvalidValue);
  if (outOfDeviceMemory()) return setError(cudaErrorMemoryAllocation);
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return setError(cudaErrorMemoryAllocation);
  std::memset(*p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(allocMutex);
  allocations()[reinterpret_cast<uintptr_t>(*p)] = Allocation{bytes ? bytes : 1, Kind::kDevice,
                                                              deviceOf(stream(s))};
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(allocMutex);
    auto it = allocations().find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations().end() || it->second.kind != Kind::kDevice)
      return setError(cudaErrorInvalidValue);
  }
  return setError(enqueue(s, "cudaFreeAsync", [p] {
    {
      std::lock_guard<std::mutex> lock(allocMutex);
      allocations().erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }));
}

// Queued, and as CUDA's with pageable host memory ("API synchronization behavior"): from pageable
// memory to the device the source is staged when the copy is issued (the host may reuse it at
// once); from the device to pageable memory the call returns once the copy has run (the host
// waits for the stream to reach it, without bound, as CUDA does). Device and pinned memory are
// read and written when the copy runs.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src || !rangesValid(dst, src, n, kind)) return setError(cudaErrorInvalidValue);
  auto pageable = [](const void* p, size_t bytes) {
    const std::optional<Allocation> a = find(p, bytes);
    return !a || a->kind != Kind::kPinnedHost;
  };
  if (kind == cudaMemcpyHostToDevice && pageable(src, n) && stream(s)->capture == cudaStreamCaptureStatusNone) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + n);
    return setError(enqueue(s, "cudaMemcpyAsync (staged from pageable memory)",
                            [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }));
  }
  OpPtr op;
  if (cudaError_t e = enqueue(s, "cudaMemcpyAsync", [=] { std::memmove(dst, src, n); }, nullptr, &op))
    return setError(e);
  if (kind == cudaMemcpyDeviceToHost && pageable(dst, n) && op) complete(op);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (!dst || !deviceRangeValid(dst, n, true)) return setError(cudaErrorInvalidValue);
  return setError(enqueue(s, "cudaMemsetAsync", [=] { std::memset(dst, v, n); }));
}

// The synchronous forms, on the legacy default stream (after the work of every blocking stream),
// return when CUDA's do ("API synchronization behavior" in CUDA's runtime documentation): a copy
// from pageable host memory to the device once its source is staged, before the data lands (so
// work on a non-blocking stream that is not ordered after the legacy stream may read the old
// bytes); a copy between device buffers, and a memset of device memory, without waiting at all;
// any other copy (to the host, or from pinned memory) once finished.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  countSync("cudaMemcpy");
  if (cudaError_t e = checkUnsafeDuringCapture(true)) return setError(e);
  if (n == 0) return cudaSuccess;
  if (!dst || !src || !rangesValid(dst, src, n, kind)) return setError(cudaErrorInvalidValue);
  if (kind == cudaMemcpyDeviceToDevice) return cudaMemcpyAsync(dst, src, n, kind, nullptr);
  const std::optional<Allocation> from = find(src, n);
  if (kind == cudaMemcpyHostToDevice && !(from && from->kind == Kind::kPinnedHost)) {
    if (cudaError_t e = syncLegacy()) return setError(e);  // CUDA syncs before it stages
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + n);
    return setError(enqueue(nullptr, "cudaMemcpy (staged from pageable memory)",
                            [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }));
  }
  if (cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr)) return e;
  return setError(syncLegacy());
}

cudaError_t cudaMemset(void* dst, int v, size_t n) {
  countSync("cudaMemset");
  if (cudaError_t e = checkUnsafeDuringCapture(true)) return setError(e);
  return cudaMemsetAsync(dst, v, n, nullptr);
}

}  // extern "C"
