#include "nccl_shim/settings.h"

#include "nccl_shim/real_nccl.h"
#include "nccl_shim/shim_log.h"

namespace lowrank::shim {

const Settings& settings() {
  static const Settings s = [] {
    Settings x;
    const char* why = "";
    x.ok = plugin::pluginServices().shimSettings(&x.env, &why) == 0;
    if (!x.ok) {
      SHIM_ERROR("%s: %s; every ncclAllReduce returns ncclInvalidUsage until it is fixed",
                 shimMode(), why);
      if (const char* m = lastError()) x.error = m;
    }
    else
      SHIM_INFO("%s: LOWRANK_ENABLE %d, LOWRANK_MIN_BYTES %llu", shimMode(), x.env.enable,
                (unsigned long long)x.env.minBytes);
    return x;
  }();
  return s;
}

}  // namespace lowrank::shim
