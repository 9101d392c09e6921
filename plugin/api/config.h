// Resolution of the configuration in force: explicit lowrankConfig_t fields win, LOWRANK_*
// environment variables fill unset fields, defaults the rest. The one place LOWRANK_* variables
// of the engine are parsed; a malformed value is an error naming the variable.
#pragma once
#include "engine/engine_config.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank::api {

// The sizes of lowrankConfig_t this library reads, as NCCL's config: its own, and the one before
// factorDtype was appended (a program built against that header: the fields it lacks are unset).
constexpr size_t kConfigSizeBeforeFactorDtype = 80;
inline bool configSizeKnown(size_t size) {
  return size == sizeof(lowrankConfig_t) || size == kConfigSizeBeforeFactorDtype;
}

// user may be null. Errors: lowrankInvalidArgument (bad struct header or out-of-range field),
// lowrankInvalidUsage (malformed LOWRANK_* variable).
Status resolveConfig(const lowrankConfig_t* user, EngineConfig* out);

// LOWRANK_TIMEOUT alone (seconds > 0, default 300), for calls made before any config exists.
Status timeoutFromEnv(double* seconds);

// Logs every value in force at INFO.
void logConfig(const EngineConfig& cfg, int rank, int nranks);

}  // namespace lowrank::api
