#include "util/env.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <strings.h>

namespace lowrank::env {
namespace {

Status bad(const char* name, const char* value, const char* want) {
  return Status::Error(lowrankInvalidUsage, "environment variable %s=\"%s\" is not %s", name, value,
                       want);
}

}  // namespace

Status integer(const char* name, long lo, long hi, int* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  char* end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    char want[96];
    snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
    return bad(name, v, want);
  }
  *out = int(x);
  return Status::Ok();
}

Status number(const char* name, double lo, bool loOpen, double* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  char* end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end || !std::isfinite(x) || x < lo || (loOpen && x == lo)) {
    char want[96];
    snprintf(want, sizeof want, "a number %s %g", loOpen ? ">" : ">=", lo);
    return bad(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status boolean(const char* name, bool* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
    *out = true;
  else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
    *out = false;
  else
    return bad(name, v, "a boolean (0/1, true/false, yes/no, on/off)");
  return Status::Ok();
}

Status choice(const char* name, const char* const* names, int count, int* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  for (int i = 0; i < count; ++i)
    if (!strcasecmp(v, names[i])) {
      *out = i;
      return Status::Ok();
    }
  std::string want = "one of";
  for (int i = 0; i < count; ++i) (want += i ? ", " : " ") += names[i];
  return bad(name, v, want.c_str());
}

Status unsignedInteger(const char* name, uint64_t* out, unsigned long long max) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  char* end;
  errno = 0;
  // Decimal digits only: strtoull alone would take " -1" as 2^64 - 1 and "010" as octal.
  const bool digits = v[strspn(v, "0123456789")] == 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!digits || errno || *end || x > max) {
    char want[96];
    snprintf(want, sizeof want, "a decimal integer in [0, %llu]", max);
    return bad(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status checkDebug() {
  const char* v = getenv("LOWRANK_DEBUG");
  if (!v || !*v) return Status::Ok();
  for (const char* ok : {"NONE", "VERSION", "WARN", "INFO", "TRACE"})
    if (!strcasecmp(v, ok)) return Status::Ok();
  return bad("LOWRANK_DEBUG", v, "one of WARN, INFO, TRACE, VERSION, NONE");
}

Status shimEnv(ShimEnv* out) {
  ShimEnv e;
  LR_RETURN_IF_ERROR(boolean("LOWRANK_ENABLE", &e.enable));
  if (!e.enable) {  // the kill switch: nothing else is read, so nothing else can fail
    *out = e;
    return Status::Ok();
  }
  LR_RETURN_IF_ERROR(checkDebug());
  LR_RETURN_IF_ERROR(unsignedInteger("LOWRANK_MIN_BYTES", &e.minBytes));  // any non-negative integer
  *out = e;
  return Status::Ok();
}

}  // namespace lowrank::env
