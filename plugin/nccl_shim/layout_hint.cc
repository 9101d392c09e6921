#include "nccl_shim/layout_hint.h"

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "lowrank/lowrank_nccl.h"
#include "nccl_shim/comm_registry.h"
#include "nccl_shim/guard.h"
#include "nccl_shim/shim_log.h"

namespace lowrank::shim {
namespace {

struct Hints {
  std::mutex mu;
  uint64_t versions = 0;
  std::unordered_map<const void*, std::shared_ptr<const LayoutHint>> byBuffer;
};

Hints& hints() {
  static Hints* h = new Hints();
  return *h;
}

lowrankResult_t bad(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
lowrankResult_t bad(const char* fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  SHIM_ERROR("lowrankNcclSetBucketLayout: %s", msg);
  return lowrankInvalidArgument;
}

}  // namespace

std::shared_ptr<const LayoutHint> layoutHint(const void* recv) {
  Hints& h = hints();
  std::lock_guard<std::mutex> lock(h.mu);
  auto it = h.byBuffer.find(recv);
  return it == h.byBuffer.end() ? nullptr : it->second;
}

}  // namespace lowrank::shim

using namespace lowrank::shim;

extern "C" __attribute__((visibility("default"))) lowrankResult_t lowrankNcclSetBucketLayout(
    const void* recvbuff, int ntensors, const int* ndims, const int64_t* shapes) {
  if (!recvbuff) return bad("recvbuff is NULL");
  Hints& h = hints();
  if (ntensors == 0) {  // forget the hint; the buffer's state (and layout) go at its next call
    {
      std::lock_guard<std::mutex> lock(h.mu);
      h.byBuffer.erase(recvbuff);
    }
    forEachComm([&](ShimComm& c) {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.layouts.erase(recvbuff) && c.lr.load()) {
        Guard g;
        lowrankBufferRelease(c.lr.load(), recvbuff);
      }
    });
    return lowrankSuccess;
  }
  if (ntensors < 0) return bad("ntensors is %d", ntensors);
  if (!ndims || !shapes) return bad("%s is NULL", ndims ? "shapes" : "ndims");
  auto hint = std::make_shared<LayoutHint>();
  size_t at = 0;
  for (int t = 0; t < ntensors; ++t) {
    if (ndims[t] < 1 || ndims[t] > 8) return bad("tensor %d has %d dimensions (1 to 8)", t, ndims[t]);
    hint->ndims.push_back(ndims[t]);
    size_t n = 1;
    for (int d = 0; d < ndims[t]; ++d, ++at) {
      if (shapes[at] <= 0) return bad("tensor %d has a size <= 0 in dimension %d", t, d);
      if (__builtin_mul_overflow(n, size_t(shapes[at]), &n))
        return bad("tensor %d has too many elements", t);
      hint->dims.push_back(size_t(shapes[at]));
    }
    if (__builtin_add_overflow(hint->elements, n, &hint->elements))
      return bad("the tensors have too many elements");
  }
  std::lock_guard<std::mutex> lock(h.mu);
  auto it = h.byBuffer.find(recvbuff);
  if (it != h.byBuffer.end() && it->second->ndims == hint->ndims && it->second->dims == hint->dims)
    return lowrankSuccess;  // the same layout again: nothing changes, state is kept
  hint->version = ++h.versions;
  h.byBuffer[recvbuff] = std::move(hint);
  SHIM_INFO("layout of buffer %p: %d tensors (per-tensor mode from its next compressed call)",
            recvbuff, ntensors);
  return lowrankSuccess;
}
