#include "util/status.h"

#include <cstdio>

#include "util/log.h"

namespace lowrank {

Status Status::Error(lowrankResult_t code, const char* fmt, ...) {
  Status s;
  s.code = code;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s.msg = buf;
  LR_WARN("%s: %s", lowrankGetErrorString(code), buf);
  return s;
}

}  // namespace lowrank
