// The shim's link to liblowrank's services (plugin/abi/services.h): the one logging state, the
// LOWRANK_* settings, the real NCCL and the dtype names of the process.
#include "abi/plugin_log.h"

namespace lowrank::plugin {

const lowrankServices_t& pluginServices() { return servicesOrAbort("lowrank NCCL shim"); }

}  // namespace lowrank::plugin
