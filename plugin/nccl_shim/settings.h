// The shim's variables (LOWRANK_ENABLE, LOWRANK_MIN_BYTES, LOWRANK_START_ITER), parsed once per
// process by plugin/api/config.cc (shimEnvFromEnv), the one place LOWRANK_* variables are parsed.
#pragma once
#include <string>

#include "api/config.h"

namespace lowrank::shim {

struct Settings {
  bool ok = false;       // false: a variable is malformed; the message was printed once
  std::string error;     // that message, for ncclGetLastError
  api::ShimEnv env;
};

const Settings& settings();

}  // namespace lowrank::shim
