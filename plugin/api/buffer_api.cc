// Per-buffer state (layout, view, tensor ranks, reset, release) and statistics: argument checks, then the
// engine (engine/engine.h).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "api/errors.h"
#include "api/export.h"
#include "engine/checkpoint.h"

using lowrank::api::fail;

namespace {

// The checks of one tensor's shape, shared by SetLayout and SetTensors: ndims in [1, 8], sizes > 0,
// and a total that does not overflow size_t (the plan trusts the layout's sums). Appends the shape.
lowrankResult_t addShape(lowrankComm_t comm, const char* fn, int t, int ndims, const size_t* dims,
                         size_t* total, lowrank::Layout* layout, const uint64_t* id = nullptr) {
  char name[64];  // "tensor 3", or "tensor 3 (id 17)" for SetTensors
  if (id) snprintf(name, sizeof name, "tensor %d (id %llu)", t, (unsigned long long)*id);
  else snprintf(name, sizeof name, "tensor %d", t);
  if (ndims < 1 || ndims > LOWRANK_MAX_DIMS)
    return fail(comm, lowrankInvalidArgument, "%s: %s has %d dimensions (1..8 allowed)", fn, name,
                ndims);
  if (!dims) return fail(comm, lowrankInvalidArgument, "%s: shapes[%d] is NULL", fn, t);
  lowrank::Shape shape;
  size_t numel = 1;
  for (int d = 0; d < ndims; ++d) {
    if (dims[d] == 0)
      return fail(comm, lowrankInvalidArgument, "%s: %s has size 0 in dimension %d", fn, name, d);
    if (__builtin_mul_overflow(numel, dims[d], &numel))
      return fail(comm, lowrankInvalidArgument, "%s: the elements of %s overflow size_t", fn, name);
    shape.push_back(dims[d]);
  }
  if (__builtin_add_overflow(*total, numel, total))
    return fail(comm, lowrankInvalidArgument, "%s: the elements of %s overflow size_t", fn, name);
  layout->push_back(std::move(shape));
  return lowrankSuccess;
}

}  // namespace

LOWRANK_API lowrankResult_t lowrankBufferSetLayout(lowrankComm_t comm, const void* recvbuff,
                                                   int ntensors, const int* ndims,
                                                   const size_t* const* shapes) {
  static const char* fn = "lowrankBufferSetLayout";
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "%s: comm is NULL", fn);
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    if (!recvbuff || !ndims || !shapes)
      return fail(comm, lowrankInvalidArgument, "%s: %s is NULL", fn,
                  !recvbuff ? "recvbuff" : !ndims ? "ndims" : "shapes");
    if (ntensors <= 0) return fail(comm, lowrankInvalidArgument, "%s: ntensors %d <= 0", fn, ntensors);
    lowrank::Layout layout;
    size_t total = 0;
    for (int t = 0; t < ntensors; ++t)
      if (lowrankResult_t r = addShape(comm, fn, t, ndims[t], shapes[t], &total, &layout)) return r;
    comm->engine->setLayout(recvbuff, std::move(layout));
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferSetTensors(lowrankComm_t comm, const void* recvbuff,
                                                    int ntensors, const lowrankTensor_t* tensors) {
  static const char* fn = "lowrankBufferSetTensors";
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "%s: comm is NULL", fn);
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    if (!recvbuff || !tensors)
      return fail(comm, lowrankInvalidArgument, "%s: %s is NULL", fn, !recvbuff ? "recvbuff" : "tensors");
    if (ntensors <= 0) return fail(comm, lowrankInvalidArgument, "%s: ntensors %d <= 0", fn, ntensors);
    lowrank::Layout layout;
    lowrank::TensorIds ids;
    size_t total = 0;
    std::unordered_set<uint64_t> seen;
    for (int t = 0; t < ntensors; ++t) {
      const lowrankTensor_t& x = tensors[t];
      if (lowrankResult_t r = addShape(comm, fn, t, x.ndims, x.shape, &total, &layout, &x.id))
        return r;
      if (x.approxRank < LOWRANK_RANK_DEFAULT || x.approxRank > 65536)
        return fail(comm, lowrankInvalidArgument,
                    "%s: tensor %d (id %llu) has approxRank %d (-1 default, 0 exact, or 1..65536)",
                    fn, t, (unsigned long long)x.id, x.approxRank);
      if (!seen.insert(x.id).second)
        return fail(comm, lowrankInvalidArgument, "%s: id %llu is given twice (tensor %d)", fn,
                    (unsigned long long)x.id, t);
      ids.ids.push_back(x.id);
      ids.ranks.push_back(x.approxRank);
    }
    const lowrank::Status st = comm->engine->setTensors(recvbuff, std::move(layout), std::move(ids));
    return st.ok() ? lowrankSuccess : fail(comm, st);
  });
}

LOWRANK_API lowrankResult_t lowrankBufferGetView(lowrankComm_t comm, const void* recvbuff,
                                                 lowrankBufferView_t* view) {
  if (!comm || !recvbuff || !view)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferGetView: %s is NULL",
                !comm ? "comm" : !recvbuff ? "recvbuff" : "view");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->view(recvbuff, view);
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferGetTensorRanks(lowrankComm_t comm, const void* recvbuff,
                                                        int* ntensors, int* approxRanks) {
  static const char* fn = "lowrankBufferGetTensorRanks";
  if (!comm || !recvbuff || !ntensors)
    return fail(comm, lowrankInvalidArgument, "%s: %s is NULL", fn,
                !comm ? "comm" : !recvbuff ? "recvbuff" : "ntensors");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    const std::vector<int> ranks = comm->engine->tensorRanks(recvbuff);
    const int room = *ntensors;
    *ntensors = int(ranks.size());
    if (!approxRanks) return lowrankSuccess;
    if (room < int(ranks.size()))
      return fail(comm, lowrankInvalidArgument,
                  "%s: buffer %p has %zu tensors, room for %d given (*ntensors is now the number "
                  "needed)", fn, recvbuff, ranks.size(), room);
    std::copy(ranks.begin(), ranks.end(), approxRanks);
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferReset(lowrankComm_t comm, const void* recvbuff) {
  if (!comm || !recvbuff)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferReset: %s is NULL", comm ? "recvbuff" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->reset(recvbuff);
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferSetAlternate(lowrankComm_t comm, const void* recvbuff,
                                                      int alternate) {
  if (!comm || !recvbuff)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferSetAlternate: %s is NULL",
                comm ? "recvbuff" : "comm");
  if (alternate != LOWRANK_ALTERNATE_DEFAULT && alternate != 0 && alternate != 1)
    return fail(comm, lowrankInvalidArgument,
                "lowrankBufferSetAlternate: alternate is %d, not 0, 1 or LOWRANK_ALTERNATE_DEFAULT",
                alternate);
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    if (alternate == 1 && !comm->engine->config().warmStart)
      return fail(comm, lowrankInvalidArgument,
                  "lowrankBufferSetAlternate: alternate 1 needs the communicator's warmStart 1");
    comm->engine->setAlternate(recvbuff, alternate);
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferRelease(lowrankComm_t comm, const void* recvbuff) {
  if (!comm || !recvbuff)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferRelease: %s is NULL", comm ? "recvbuff" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->release(recvbuff);
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferSaveState(lowrankComm_t comm, const void* recvbuff,
                                                   void* bytes, size_t* size) {
  if (!comm || !recvbuff || !size)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferSaveState: %s is NULL",
                !comm ? "comm" : !recvbuff ? "recvbuff" : "size");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    const lowrank::Status st = comm->engine->saveState(recvbuff, bytes, size);
    return st.ok() ? lowrankSuccess : fail(comm, st);
  });
}

LOWRANK_API lowrankResult_t lowrankBufferRestoreState(lowrankComm_t comm, const void* recvbuff,
                                                      const void* bytes, size_t size) {
  if (!comm || !recvbuff || !bytes)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferRestoreState: %s is NULL",
                !comm ? "comm" : !recvbuff ? "recvbuff" : "bytes");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    const lowrank::Status st = comm->engine->restoreState(recvbuff, bytes, size);
    return st.ok() ? lowrankSuccess : fail(comm, st);
  });
}

LOWRANK_API lowrankResult_t lowrankStateAddCalls(void* bytes, size_t size, uint64_t calls) {
  if (!bytes) return fail(nullptr, lowrankInvalidArgument, "lowrankStateAddCalls: bytes is NULL");
  const lowrank::Status st = lowrank::addCalls(bytes, size, calls);  // no comm: nothing to lock
  return st.ok() ? lowrankSuccess : fail(nullptr, st);
}

LOWRANK_API lowrankResult_t lowrankCommGetTransportInfo(lowrankComm_t comm, char* json, size_t size,
                                                        size_t* needed) {
  if (!comm || (!json && size > 0))
    return fail(comm, lowrankInvalidArgument, "lowrankCommGetTransportInfo: %s is NULL",
                comm ? "json" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    const std::string s = comm->engine->transportInfo();  // no call lock: the transport locks
    if (needed) *needed = s.size() + 1;
    if (size > 0) snprintf(json, size, "%s", s.c_str());
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankBufferGetMemory(lowrankComm_t comm, const void* recvbuff,
                                                   lowrankMemoryInfo_t* info) {
  static const char* fn = "lowrankBufferGetMemory";
  if (!comm || !recvbuff || !info)
    return fail(comm, lowrankInvalidArgument, "%s: %s is NULL", fn,
                !comm ? "comm" : !recvbuff ? "recvbuff" : "info");
  // The first version's fields are the floor; a later header's struct is filled as far as ours.
  constexpr size_t kFirst = offsetof(lowrankMemoryInfo_t, totalBytes) + sizeof(uint64_t);
  if (info->size < kFirst || info->size % 8)
    return fail(comm, lowrankInvalidArgument,
                "%s: info->size is %zu, not the size of a lowrankMemoryInfo_t (at least %zu, a "
                "multiple of 8): set it to sizeof(lowrankMemoryInfo_t) "
                "(LOWRANK_MEMORY_INFO_INITIALIZER)", fn, info->size, kFirst);
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    lowrankMemoryInfo_t mine{};
    mine.size = sizeof mine;
    comm->engine->memory(recvbuff, &mine);
    const size_t size = info->size;
    std::memcpy(reinterpret_cast<char*>(info) + sizeof(size_t),
                reinterpret_cast<const char*>(&mine) + sizeof(size_t),
                std::min(size, sizeof mine) - sizeof(size_t));
    return lowrankSuccess;
  });
}

LOWRANK_API lowrankResult_t lowrankGetStats(lowrankComm_t comm, lowrankStats_t* stats) {
  if (!comm || !stats)
    return fail(comm, lowrankInvalidArgument, "lowrankGetStats: %s is NULL", comm ? "stats" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->stats(stats);
    return lowrankSuccess;
  });
}
