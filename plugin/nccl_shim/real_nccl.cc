#include "nccl_shim/real_nccl.h"

#include <atomic>
#include <string>

#include "abi/plugin_log.h"
#include "nccl_shim/shim_log.h"

namespace lowrank::shim {
namespace {

#ifdef LOWRANK_SHIM_DROPIN
constexpr bool kDropIn = true;
#else
constexpr bool kDropIn = false;
#endif

struct Loaded {
  const Real* real = nullptr;
  std::string error;  // empty when loaded
};

Loaded load() {
  Loaded l;
  if (kDropIn && !plugin::pluginServices().env("LOWRANK_NCCL_LIBRARY")) {
    l.error = "LOWRANK_NCCL_LIBRARY is not set: the drop-in libnccl.so.2 needs the path of the real "
              "NCCL library (e.g. LOWRANK_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2)";
    return l;
  }
  const char* why = "";
  l.real = plugin::pluginServices().realNccl(&why);
  if (!l.real) {
    l.error = why;
    return l;
  }
  int v = 0;
  l.real->getVersion(&v);
  SHIM_INFO("%s: real NCCL %s, version %d", shimMode(), l.real->path, v);
  return l;
}

std::atomic<const Loaded*> published{nullptr};  // set once loaded() has finished

const Loaded& loaded() {
  static Loaded* l = [] {
    auto* x = new Loaded(load());  // never freed: used until the process ends
    if (!x->error.empty()) SHIM_ERROR("%s: %s", shimMode(), x->error.c_str());
    published.store(x);
    return x;
  }();
  return *l;
}

}  // namespace

const char* shimMode() { return kDropIn ? "drop-in libnccl.so.2" : "LD_PRELOAD shim"; }

const Real* real() { return loaded().real; }

const char* realError() { return loaded().error.c_str(); }

const Real* realIfLoaded() {
  const Loaded* l = published.load();
  return l ? l->real : nullptr;
}

void* realHandle() {
  const Real* r = real();
  return r ? r->handle : nullptr;
}

}  // namespace lowrank::shim

// The mark of a lowrank shim (plugin/platform/nccl.h: kShimMarker): liblowrank never takes a
// library that exports it for the real NCCL, whose calls would come straight back here.
extern "C" __attribute__((visibility("default"))) int lowrankNcclShimMarker(void) { return 1; }
