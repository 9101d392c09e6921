// Per-buffer state (layout, view, reset, release) and statistics: argument checks, then the
// engine (engine/engine.h).
#include "api/errors.h"
#include "api/export.h"

using lowrank::api::fail;

LOWRANK_API lowrankResult_t lowrankBufferSetLayout(lowrankComm_t comm, const void* recvbuff,
                                                   int ntensors, const int* ndims,
                                                   const size_t* const* shapes) {
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankBufferSetLayout: comm is NULL");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    if (!recvbuff || !ndims || !shapes)
      return fail(comm, lowrankInvalidArgument, "lowrankBufferSetLayout: %s is NULL",
                  !recvbuff ? "recvbuff" : !ndims ? "ndims" : "shapes");
    if (ntensors <= 0)
      return fail(comm, lowrankInvalidArgument, "lowrankBufferSetLayout: ntensors %d <= 0", ntensors);
    lowrank::Layout layout(ntensors);
    size_t total = 0;  // checked for overflow, so that the plan can trust the layout's sums
    for (int t = 0; t < ntensors; ++t) {
      if (ndims[t] < 1 || ndims[t] > 8)
        return fail(comm, lowrankInvalidArgument,
                    "lowrankBufferSetLayout: tensor %d has %d dimensions (1..8 allowed)", t, ndims[t]);
      if (!shapes[t])
        return fail(comm, lowrankInvalidArgument, "lowrankBufferSetLayout: shapes[%d] is NULL", t);
      size_t numel = 1;
      for (int d = 0; d < ndims[t]; ++d) {
        if (shapes[t][d] == 0)
          return fail(comm, lowrankInvalidArgument,
                      "lowrankBufferSetLayout: tensor %d has size 0 in dimension %d", t, d);
        if (__builtin_mul_overflow(numel, shapes[t][d], &numel) ||
            __builtin_add_overflow(total, numel, &total))
          return fail(comm, lowrankInvalidArgument,
                      "lowrankBufferSetLayout: the elements of tensor %d overflow size_t", t);
        layout[t].push_back(shapes[t][d]);
      }
    }
    comm->engine->setLayout(recvbuff, std::move(layout));
    return lowrankSuccess;
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

LOWRANK_API lowrankResult_t lowrankBufferReset(lowrankComm_t comm, const void* recvbuff) {
  if (!comm || !recvbuff)
    return fail(comm, lowrankInvalidArgument, "lowrankBufferReset: %s is NULL", comm ? "recvbuff" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->reset(recvbuff);
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

LOWRANK_API lowrankResult_t lowrankGetStats(lowrankComm_t comm, lowrankStats_t* stats) {
  if (!comm || !stats)
    return fail(comm, lowrankInvalidArgument, "lowrankGetStats: %s is NULL", comm ? "stats" : "comm");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    comm->engine->stats(stats);
    return lowrankSuccess;
  });
}
