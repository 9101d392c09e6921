#include "engine/comm_init.h"

#include <cstring>
#include <memory>

#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/launcher_env.h"

namespace lowrank {

Status makeUniqueId(lowrankUniqueId* id, double timeoutSec) {
  return bootstrap::makeUniqueId(id, timeoutSec);
}

Status launcherUniqueId(double timeoutSec, lowrankUniqueId* id, int* rank, int* size) {
  bootstrap::LauncherEnv env;
  LR_RETURN_IF_ERROR(bootstrap::readLauncherEnv(&env));
  LR_RETURN_IF_ERROR(bootstrap::uniqueIdFromLauncherEnv(env, timeoutSec, id));
  *rank = env.rank;
  *size = env.size;
  return Status::Ok();
}

Status ncclUniqueId(void* id) {
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));
  LR_RETURN_IF_ERROR(nccl::requireEntry(*api, api->getUniqueId != nullptr, "ncclGetUniqueId"));
  return nccl::fromNccl(*api, api->getUniqueId(static_cast<nccl::UniqueId*>(id)), "ncclGetUniqueId");
}

Status ncclLibrary(const char** path, const char** source, int* version) {
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNcclSource(&api, source));
  *path = api->path;
  *version = 0;
  return nccl::fromNccl(*api, api->getVersion(version), "ncclGetVersion");
}

Status ncclCommInit(void** ncclComm, int nranks, const void* id, int rank, double timeoutSec) {
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));
  LR_RETURN_IF_ERROR(nccl::requireEntry(*api, api->commInitRank != nullptr, "ncclCommInitRank"));
  nccl::UniqueId uid;
  std::memcpy(&uid, id, sizeof uid);
  const nccl::Result r = api->commInitRank(ncclComm, nranks, uid, rank);
  return nccl::settle(*api, *ncclComm, r, timeoutSec, "ncclCommInitRank");
}

bool isDeviceBuffer(const void* p) { return platform::isDevicePointer(p); }

}  // namespace lowrank
