// lowrankAllReduce: argument checks, then the engine.
#include <cstdint>

#include "api/errors.h"
#include "api/export.h"
#include "engine/comm_init.h"
#include "util/c_enum.h"
#include "util/dtype.h"

using lowrank::api::fail;

LOWRANK_API lowrankResult_t lowrankAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             lowrankDataType_t datatype, lowrankRedOp_t op,
                                             lowrankComm_t comm, void* stream) {
  if (!comm) return fail(nullptr, lowrankInvalidArgument, "lowrankAllReduce: comm is NULL");
  return lowrank::api::guarded(comm, [&]() -> lowrankResult_t {
    std::lock_guard<std::mutex> lock(comm->callMu);
    if (!sendbuff || !recvbuff)
      return fail(comm, lowrankInvalidArgument, "lowrankAllReduce: %s is NULL",
                  sendbuff ? "recvbuff" : "sendbuff");
    if (count == 0) return fail(comm, lowrankInvalidArgument, "lowrankAllReduce: count is 0");
    if (const int v = lowrank::cEnumValue(datatype); v < 0 || v >= lowrankNumTypes)
      return fail(comm, lowrankInvalidArgument, "lowrankAllReduce: unknown datatype %d", v);
    if (const int v = lowrank::cEnumValue(op); v < 0 || v >= lowrankNumOps)
      return fail(comm, lowrankInvalidArgument, "lowrankAllReduce: unknown op %d", v);
    const size_t es = lowrank::dtypeSize(datatype);
    if (uintptr_t(sendbuff) % es || uintptr_t(recvbuff) % es)
      return fail(comm, lowrankInvalidArgument,
                  "lowrankAllReduce: buffers must be aligned to %zu bytes (%s): sendbuff %p, "
                  "recvbuff %p", es, lowrank::dtypeName(datatype), sendbuff, recvbuff);
    if (count > SIZE_MAX / es)
      return fail(comm, lowrankInvalidArgument, "lowrankAllReduce: count %zu overflows", count);
    const uintptr_t s = uintptr_t(sendbuff), r = uintptr_t(recvbuff), bytes = count * es;
    if (s != r && s < r + bytes && r < s + bytes)
      return fail(comm, lowrankInvalidArgument,
                  "lowrankAllReduce: sendbuff and recvbuff overlap without being equal");
    // Device memory is told apart by the CUDA driver, if the process has loaded one.
    const bool sendDev = lowrank::isDeviceBuffer(sendbuff);
    const bool recvDev = s == r ? sendDev : lowrank::isDeviceBuffer(recvbuff);
    if (sendDev != recvDev)
      return fail(comm, lowrankInvalidArgument,
                  "lowrankAllReduce: sendbuff %p is %s memory but recvbuff %p is %s memory",
                  sendbuff, sendDev ? "device" : "host", recvbuff, recvDev ? "device" : "host");
    // Host buffers on an NCCL communicator: the stream goes nowhere (NCCL gets the host engine's
    // factor buffers); elsewhere a stream with host buffers is a mistake worth reporting.
    if (stream && !sendDev && !comm->engine->onNccl())
      return fail(comm, lowrankInvalidArgument,
                  "lowrankAllReduce: a stream was given with host buffers (pass NULL)");
    lowrank::Status st =
        comm->engine->allReduce(sendbuff, recvbuff, count, datatype, op, stream, sendDev);
    return st.ok() ? lowrankSuccess : fail(comm, st);
  });
}
