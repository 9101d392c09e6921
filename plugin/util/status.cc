#include "util/status.h"

#include <cstdio>

#include "util/log.h"

namespace lowrank {
namespace {

// The code's name for the log line (lowrankGetErrorString's text points users to
// lowrankGetLastError, which the log line itself already is).
const char* codeName(lowrankResult_t code) {
  switch (code) {
    case lowrankUnhandledCudaError: return "unhandled CUDA error";
    case lowrankSystemError: return "system error";
    case lowrankInternalError: return "internal error";
    case lowrankInvalidArgument: return "invalid argument";
    case lowrankInvalidUsage: return "invalid usage";
    case lowrankRemoteError: return "remote error";
    case lowrankTimeout: return "timeout";
    default: return lowrankGetErrorString(code);
  }
}

}  // namespace

Status Status::Error(lowrankResult_t code, const char* fmt, ...) {
  Status s;
  s.code = code;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s.msg = buf;
  LR_WARN("%s: %s", codeName(code), buf);
  return s;
}

}  // namespace lowrank
