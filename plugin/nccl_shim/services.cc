// The shim's link to liblowrank's services (plugin/abi/services.h): the one logging state, the
// LOWRANK_* settings, the real NCCL and the dtype names of the process.
#include <cstdio>
#include <cstdlib>

#include "abi/plugin_log.h"

namespace lowrank::plugin {

const lowrankServices_t& pluginServices() {
  static const lowrankServices_t* s = [] {
    const lowrankServices_t* t = lowrankGetServices(LOWRANK_SERVICES_VERSION);
    if (!t) {  // a liblowrank from another tree: nothing here can work
      fprintf(stderr, "lowrank NCCL shim: the liblowrank.so loaded cannot serve services version "
                      "%d (a shim and a liblowrank of different builds); aborting\n",
              LOWRANK_SERVICES_VERSION);
      abort();
    }
    return t;
  }();
  return *s;
}

}  // namespace lowrank::plugin
