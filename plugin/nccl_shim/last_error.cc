#include "nccl_shim/last_error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "nccl_shim/guard.h"
#include "nccl_shim/real_nccl.h"
#include "abi/plugin_log.h"

namespace lowrank::shim {
namespace {

// Fixed buffers, as NCCL's: a pointer ncclGetLastError returned stays valid.
constexpr size_t kLen = 1024;
thread_local char mine[kLen];
thread_local char realThen[kLen];  // the real library's text when ours was set

// The real library's last error text on this thread ("" if it has none or cannot say).
const char* realText() {
  const Real* r = realIfLoaded();
  if (!r || !r->getLastError) return "";
  Guard g;
  const char* t = r->getLastError(nullptr);
  return t ? t : "";
}

}  // namespace

const char* lastError() {
  // Not when the real library has failed since: its text is the newer.
  if (!mine[0] || std::strncmp(realText(), realThen, kLen - 1) != 0) return nullptr;
  return mine;
}

void setLastError(const char* msg) {
  std::snprintf(mine, kLen, "%s", msg ? msg : "");
  std::snprintf(realThen, kLen, "%s", realText());
}

void clearLastError() { mine[0] = 0; }

void reportError(const char* file, int line, const char* fmt, ...) {
  static const char kPrefix[] = "lowrank NCCL shim: ";
  char msg[kLen];
  std::memcpy(msg, kPrefix, sizeof kPrefix);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + sizeof kPrefix - 1, kLen - (sizeof kPrefix - 1), fmt, ap);
  va_end(ap);
  plugin::logf(lowrankLogWarn, file, line, "NCCL shim: %s", msg + sizeof kPrefix - 1);
  setLastError(msg);
}

}  // namespace lowrank::shim
