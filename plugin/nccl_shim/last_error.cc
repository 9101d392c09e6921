#include "nccl_shim/last_error.h"

#include <cstdarg>
#include <cstdio>
#include <string>

#include "util/log.h"

namespace lowrank::shim {
namespace {
thread_local std::string last;
}  // namespace

const char* lastError() { return last.empty() ? nullptr : last.c_str(); }
void setLastError(const char* msg) { last = msg ? msg : ""; }
void clearLastError() { last.clear(); }

void reportError(const char* file, int line, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  logPrint(LogLevel::Warn, file, line, "NCCL shim: %s", buf);
  last = std::string("lowrank NCCL shim: ") + buf;
}

}  // namespace lowrank::shim
