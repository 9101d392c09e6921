#include "nccl_shim/real_nccl.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "nccl_shim/shim_log.h"
#include "platform/nccl.h"

namespace lowrank::shim {
namespace {

#ifdef LOWRANK_SHIM_DROPIN
constexpr bool kDropIn = true;
#else
constexpr bool kDropIn = false;
#endif

struct Loaded {
  Real real;
  std::string error;  // empty when loaded
};

// True when p is code of this very library (the shim), not of the real NCCL.
bool inThisLibrary(const void* p) {
  Dl_info mine{}, theirs{};
  if (!dladdr(reinterpret_cast<const void*>(&inThisLibrary), &mine) || !dladdr(p, &theirs))
    return false;
  return mine.dli_fbase == theirs.dli_fbase;
}

// Opens the library: see real_nccl.h for the order.
std::string open(Real* r) {
  const char* env = getenv("LOWRANK_NCCL_LIBRARY");
  if (env && *env) {
    r->path = env;
    r->handle = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!r->handle)
      return std::string("cannot load LOWRANK_NCCL_LIBRARY=") + env + ": " + dlerror();
    return "";
  }
  if (kDropIn)
    return "LOWRANK_NCCL_LIBRARY is not set: the drop-in libnccl.so.2 needs the path of the real "
           "NCCL library (e.g. LOWRANK_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2)";
  r->path = "libnccl.so.2";
  r->handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!r->handle) {
    r->path = "the next library after the shim (RTLD_NEXT)";
    r->handle = RTLD_NEXT;
  }
  return "";
}

std::string load(Real* r) {
  std::string err = open(r);
  if (!err.empty()) return err;
  struct Need { const char* name; bool ok; };
  const Need need[] = {
      {"ncclAllReduce", nccl::resolveEntry(r->handle, "ncclAllReduce", &r->allReduce)},
      {"ncclGroupStart", nccl::resolveEntry(r->handle, "ncclGroupStart", &r->groupStart)},
      {"ncclGroupEnd", nccl::resolveEntry(r->handle, "ncclGroupEnd", &r->groupEnd)},
      {"ncclCommDestroy", nccl::resolveEntry(r->handle, "ncclCommDestroy", &r->commDestroy)},
      {"ncclCommAbort", nccl::resolveEntry(r->handle, "ncclCommAbort", &r->commAbort)},
      {"ncclCommCount", nccl::resolveEntry(r->handle, "ncclCommCount", &r->commCount)},
      {"ncclCommUserRank", nccl::resolveEntry(r->handle, "ncclCommUserRank", &r->commUserRank)},
      {"ncclGetVersion", nccl::resolveEntry(r->handle, "ncclGetVersion", &r->getVersion)},
      {"ncclGetErrorString", nccl::resolveEntry(r->handle, "ncclGetErrorString", &r->getErrorString)},
  };
  for (const Need& n : need)
    if (!n.ok) return "the NCCL library " + r->path + " has no symbol " + n.name;
  nccl::resolveEntry(r->handle, "ncclGroupSimulateEnd", &r->groupSimulateEnd);
  nccl::resolveEntry(r->handle, "ncclCommFinalize", &r->commFinalize);
  nccl::resolveEntry(r->handle, "ncclCommCuDevice", &r->commCuDevice);
  nccl::resolveEntry(r->handle, "ncclRedOpCreatePreMulSum", &r->redOpCreatePreMulSum);
  nccl::resolveEntry(r->handle, "ncclRedOpDestroy", &r->redOpDestroy);
  nccl::resolveEntry(r->handle, "ncclGetLastError", &r->getLastError);
  // The library found must not be this one: its calls would come straight back here.
  if (inThisLibrary(reinterpret_cast<const void*>(r->allReduce)) ||
      inThisLibrary(reinterpret_cast<const void*>(r->getVersion)))
    return r->path + " is the lowrank shim itself, not the real NCCL library" +
           (kDropIn ? " (LOWRANK_NCCL_LIBRARY must name the real libnccl.so.2)" : "");
  int v = 0;
  r->getVersion(&v);
  SHIM_INFO("%s: real NCCL %s, version %d", shimMode(), r->path.c_str(), v);
  return "";
}

std::atomic<const Loaded*> published{nullptr};  // set once loaded() has finished

const Loaded& loaded() {
  static Loaded* l = [] {
    auto* x = new Loaded();  // never freed: used until the process ends
    x->error = load(&x->real);
    if (!x->error.empty()) SHIM_ERROR("%s: %s", shimMode(), x->error.c_str());
    published.store(x);
    return x;
  }();
  return *l;
}

}  // namespace

const char* shimMode() { return kDropIn ? "drop-in libnccl.so.2" : "LD_PRELOAD shim"; }

const Real* real() {
  const Loaded& l = loaded();
  return l.error.empty() ? &l.real : nullptr;
}

const char* realError() { return loaded().error.c_str(); }

const Real* realIfLoaded() {
  const Loaded* l = published.load();
  return l && l->error.empty() ? &l->real : nullptr;
}

void* realHandle() {
  const Real* r = real();
  return r ? r->handle : nullptr;
}

}  // namespace lowrank::shim
