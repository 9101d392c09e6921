// lowrankGetServices: liblowrank's common parts, lent to its plugins through one plain-C table
// (plugin/abi/services.h), so that the shim and the CUDA backend share this library's logging,
// environment, real NCCL and CUDA probes instead of compiling their own.
#include "abi/services.h"

#include <mutex>
#include <string>

#include "platform/cuda_probe.h"
#include "platform/nccl.h"
#include "util/dtype.h"
#include "util/env.h"
#include "util/log.h"

namespace lowrank {
namespace {

int level() { return int(logLevel()); }

void write(int lvl, const char* file, int line, const char* message) {
  if (lvl < int(LogLevel::Warn) || lvl > int(LogLevel::Trace)) lvl = int(LogLevel::Warn);
  logPrint(LogLevel(lvl), file, line, "%s", message);
}

// Parsed at the first request, then the same answer for every caller of the process.
int shimSettings(lowrankShimSettings_t* out, const char** error) {
  static env::ShimEnv parsed;
  static Status status;
  static std::once_flag once;
  std::call_once(once, [] { status = env::shimEnv(&parsed); });
  if (error) *error = status.ok() ? "" : status.msg.c_str();
  if (!status.ok()) return status.code;
  out->enable = parsed.enable;
  out->minBytes = parsed.minBytes;
  return lowrankSuccess;
}

const lowrankRealNccl_t* realNccl(const char** error) {
  static std::string message;  // of the one failed resolution (realNccl() fails the same always)
  static std::once_flag once;
  const nccl::Api* api = nullptr;
  Status s = nccl::realNccl(&api);
  if (s.ok()) return api;
  std::call_once(once, [&] { message = s.msg; });
  if (error) *error = message.c_str();
  return nullptr;
}

int isDevicePointer(const void* p) { return platform::isDevicePointer(p); }
int streamCapturing(void* stream) { return platform::streamCapturing(stream); }
int deviceEnter(int device) { return platform::DeviceGuard::enterDevice(device); }
void deviceLeave(int previous) { platform::DeviceGuard::leaveDevice(previous); }
size_t sizeOf(int dtype) { return dtypeSize(dtype); }
const char* nameOf(int dtype) { return dtypeSize(dtype) ? dtypeName(lowrankDataType_t(dtype)) : "unknown"; }
const char* opNameOf(int op) { return op >= 0 && op < lowrankNumOps ? opName(lowrankRedOp_t(op)) : "unknown"; }

constexpr lowrankServices_t kServices = {
    LOWRANK_SERVICES_VERSION, sizeof(lowrankServices_t),
    &level, &write, &setLogDevice,
    &shimSettings,
    &realNccl,
    &isDevicePointer, &streamCapturing, &deviceEnter, &deviceLeave,
    &sizeOf, &nameOf, &opNameOf,
    &env::get,
};

}  // namespace
}  // namespace lowrank

// Exported from liblowrank.so (the library is built with hidden visibility).
extern "C" __attribute__((visibility("default"))) const lowrankServices_t* lowrankGetServices(uint32_t version) {
  return version == LOWRANK_SERVICES_VERSION ? &lowrank::kServices : nullptr;
}
