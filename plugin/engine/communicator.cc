// deleteComm: the end of a communicator, and of the NCCL communicator it owns.
#include "engine/communicator.h"

#include "platform/nccl.h"

namespace lowrank {

Status deleteComm(lowrankComm* comm) {
  void* owned = comm->ownsNccl ? comm->ncclComm : nullptr;
  const bool abort = comm->aborted;
  delete comm;  // device engine, buffer states and transport: all of them use the NCCL comm
  if (!owned) return Status::Ok();
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));  // resolved already: the NCCL comm was made through it
  return abort ? nccl::fromNccl(*api, api->commAbort(owned), "ncclCommAbort")
               : nccl::fromNccl(*api, api->commDestroy(owned), "ncclCommDestroy");
}

}  // namespace lowrank
