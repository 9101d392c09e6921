// The drop-in's lazy resolution: the first call of a forwarded symbol lands here (through the
// generated stub), which finds the real symbol in LOWRANK_NCCL_LIBRARY and stores it in the jump
// table. A forwarder's signature is unknown here, so no error can be returned to the caller: a
// missing library or symbol ends the process with a message naming it.
#include <cstdlib>

#include "nccl_shim/dropin/forwarders.h"
#include "nccl_shim/real_nccl.h"
#include "nccl_shim/shim_log.h"

#include <dlfcn.h>

extern "C" __attribute__((visibility("hidden"))) void* lowrank_dropin_resolve(int i) {
  using namespace lowrank::shim;
  if (i < 0 || i >= kForwarderCount) {
    SHIM_ERROR("drop-in libnccl.so.2: bad forwarder index %d", i);
    abort();
  }
  const char* name = kForwarderNames[i];
  void* h = realHandle();  // prints why when it fails
  if (!h) {
    SHIM_ERROR("drop-in libnccl.so.2: %s was called but the real NCCL library is not available; "
               "aborting", name);
    abort();
  }
  void* f = dlsym(h, name);
  if (!f) {
    SHIM_ERROR("drop-in libnccl.so.2: the NCCL library %s has no symbol %s; aborting",
               lowrank::plugin::pluginServices().env("LOWRANK_NCCL_LIBRARY"), name);
    abort();
  }
  __atomic_store_n(&lowrank_dropin_table[i], f, __ATOMIC_RELEASE);
  return f;
}
