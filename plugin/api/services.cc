// lowrankGetServices: liblowrank's common parts, lent to its plugins through one plain-C table
// (plugin/abi/services.h), so that the shim and the CUDA backend share this library's logging and
// environment state instead of compiling their own.
#include "abi/services.h"

#include "api/export.h"
#include "util/log.h"

namespace lowrank {
namespace {

int level() { return int(logLevel()); }

void write(int lvl, const char* file, int line, const char* message) {
  if (lvl < int(LogLevel::Warn) || lvl > int(LogLevel::Trace)) lvl = int(LogLevel::Warn);
  logPrint(LogLevel(lvl), file, line, "%s", message);
}

constexpr lowrankServices_t kServices = {
    LOWRANK_SERVICES_VERSION, sizeof(lowrankServices_t), &level, &write, &setLogDevice,
};

}  // namespace
}  // namespace lowrank

LOWRANK_API const lowrankServices_t* lowrankGetServices(uint32_t version) {
  return version == LOWRANK_SERVICES_VERSION ? &lowrank::kServices : nullptr;
}
