// The plugins' log macros (LR_WARN, LR_INFO, LR_TRACE, as plugin/util/log.h's), writing through
// liblowrank's services table: one logging state per process. pluginServices() is defined once
// per plugin (it asks liblowrank for its table at load time and fails loudly without one).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "abi/services.h"

namespace lowrank::plugin {

const lowrankServices_t& pluginServices();

// What a plugin's pluginServices() returns: the table of the liblowrank it runs with, asked once
// per plugin (the static is the plugin's own: plugins are built with hidden visibility). Without
// one (a plugin of another build) nothing can work: says so, naming `plugin`, and aborts.
inline const lowrankServices_t& servicesOrAbort(const char* plugin) {
  static const lowrankServices_t* services = [plugin] {
    const lowrankServices_t* s = lowrankGetServices(LOWRANK_SERVICES_VERSION);
    if (!s) {
      fprintf(stderr, "%s: the liblowrank of this process serves no services table of version %d "
                      "(a plugin and a liblowrank of different builds); aborting\n",
              plugin, LOWRANK_SERVICES_VERSION);
      abort();
    }
    return s;
  }();
  return *services;
}

__attribute__((format(printf, 4, 5))) inline void logf(int level, const char* file, int line,
                                                       const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pluginServices().logWrite(level, file, line, msg);
}

}  // namespace lowrank::plugin

#define LR_PLUGIN_LOG(lvl, ...)                                                         \
  do {                                                                                  \
    if (::lowrank::plugin::pluginServices().logLevel() >= (lvl))                        \
      ::lowrank::plugin::logf((lvl), __FILE__, __LINE__, __VA_ARGS__);                  \
  } while (0)
#define LR_WARN(...) LR_PLUGIN_LOG(lowrankLogWarn, __VA_ARGS__)
#define LR_INFO(...) LR_PLUGIN_LOG(lowrankLogInfo, __VA_ARGS__)
#define LR_TRACE(...) LR_PLUGIN_LOG(lowrankLogTrace, __VA_ARGS__)
