// The shim's variables (LOWRANK_ENABLE, LOWRANK_MIN_BYTES), parsed once per process by liblowrank
// (lowrankServices_t.shimSettings; plugin/api/config.cc), the one place LOWRANK_* variables are
// parsed.
#pragma once
#include <string>

#include "abi/services.h"

namespace lowrank::shim {

struct Settings {
  bool ok = false;       // false: a variable is malformed; the message was printed once
  std::string error;     // that message, for ncclGetLastError
  lowrankShimSettings_t env{1, uint64_t(1) << 20};
};

const Settings& settings();

}  // namespace lowrank::shim
