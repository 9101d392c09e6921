#include "api/config.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "util/log.h"

namespace lowrank::api {
namespace {

Status badEnv(const char* name, const char* value, const char* want) {
  return Status::Error(lowrankInvalidUsage, "environment variable %s=\"%s\" is not %s", name, value,
                       want);
}

// Each parser leaves *out alone when the variable is unset or empty.
Status envInt(const char* name, long lo, long hi, int* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  char* end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    char want[96];
    snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
    return badEnv(name, v, want);
  }
  *out = int(x);
  return Status::Ok();
}

Status envDouble(const char* name, double lo, bool loOpen, double* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  char* end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end || !std::isfinite(x) || x < lo || (loOpen && x == lo)) {
    char want[96];
    snprintf(want, sizeof want, "a number %s %g", loOpen ? ">" : ">=", lo);
    return badEnv(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status envBool(const char* name, bool* out) {
  const char* v = getenv(name);
  if (!v || !*v) return Status::Ok();
  if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
    *out = true;
  else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
    *out = false;
  else
    return badEnv(name, v, "a boolean (0/1, true/false, yes/no, on/off)");
  return Status::Ok();
}

Status envSeed(const char* name, uint64_t* out, unsigned long long max = ULLONG_MAX) {
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
    return badEnv(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status checkDebugEnv() {
  const char* v = getenv("LOWRANK_DEBUG");
  if (!v || !*v) return Status::Ok();
  for (const char* ok : {"NONE", "VERSION", "WARN", "INFO", "TRACE"})
    if (!strcasecmp(v, ok)) return Status::Ok();
  return badEnv("LOWRANK_DEBUG", v, "one of WARN, INFO, TRACE, VERSION, NONE");
}

Status argError(const char* field, const char* want) {
  return Status::Error(lowrankInvalidArgument, "lowrankConfig_t.%s must be %s", field, want);
}

}  // namespace

Status timeoutFromEnv(double* seconds) {
  *seconds = 300;
  return envDouble("LOWRANK_TIMEOUT", 0, true, seconds);
}

Status resolveConfig(const lowrankConfig_t* user, EngineConfig* out) {
  EngineConfig c;  // defaults
  LR_RETURN_IF_ERROR(checkDebugEnv());
  LR_RETURN_IF_ERROR(envInt("LOWRANK_APPROX_RANK", 0, 1 << 16, &c.approxRank));
  LR_RETURN_IF_ERROR(envDouble("LOWRANK_MIN_COMPRESSION_RATE", 1, false, &c.minCompressionRate));
  LR_RETURN_IF_ERROR(envInt("LOWRANK_START_ITER", 0, 1 << 30, &c.startIter));
  LR_RETURN_IF_ERROR(envBool("LOWRANK_ERROR_FEEDBACK", &c.errorFeedback));
  LR_RETURN_IF_ERROR(envBool("LOWRANK_WARM_START", &c.warmStart));
  LR_RETURN_IF_ERROR(envDouble("LOWRANK_ORTHO_EPSILON", 0, false, &c.orthoEpsilon));
  // lowrankConfig_t.seed is a long long: a seed above it could not be given back there.
  LR_RETURN_IF_ERROR(envSeed("LOWRANK_SEED", &c.seed, LLONG_MAX));
  LR_RETURN_IF_ERROR(envDouble("LOWRANK_TIMEOUT", 0, true, &c.timeoutSec));
  LR_RETURN_IF_ERROR(envBool("LOWRANK_PIPELINE", &c.pipeline));
  int chunk = int(c.pipelineChunk);
  LR_RETURN_IF_ERROR(envInt("LOWRANK_PIPELINE_CHUNK", 1, 1 << 30, &chunk));
  c.pipelineChunk = uint64_t(chunk);
  LR_RETURN_IF_ERROR(envInt("LOWRANK_TEST_FAIL_ALLOC", -1, 1 << 30, &c.testFailAllocRank));
  if (user) {
    if (user->size != sizeof(lowrankConfig_t) || user->magic != LOWRANK_CONFIG_MAGIC)
      return Status::Error(lowrankInvalidArgument,
                           "lowrankConfig_t not initialized with LOWRANK_CONFIG_INITIALIZER "
                           "(size %zu, magic 0x%x)", user->size, user->magic);
    const lowrankConfig_t& u = *user;
    if (u.approxRank != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.approxRank < 0 || u.approxRank > (1 << 16)) return argError("approxRank", "in [0, 65536]");
      c.approxRank = u.approxRank;
    }
    if (u.minCompressionRate != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.minCompressionRate >= 1) || !std::isfinite(u.minCompressionRate))
        return argError("minCompressionRate", ">= 1");
      c.minCompressionRate = u.minCompressionRate;
    }
    if (u.startIter != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.startIter < 0) return argError("startIter", ">= 0");
      c.startIter = u.startIter;
    }
    if (u.errorFeedback != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.errorFeedback != 0 && u.errorFeedback != 1) return argError("errorFeedback", "0 or 1");
      c.errorFeedback = u.errorFeedback;
    }
    if (u.warmStart != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.warmStart != 0 && u.warmStart != 1) return argError("warmStart", "0 or 1");
      c.warmStart = u.warmStart;
    }
    if (u.orthoEpsilon != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.orthoEpsilon >= 0) || !std::isfinite(u.orthoEpsilon)) return argError("orthoEpsilon", ">= 0");
      c.orthoEpsilon = u.orthoEpsilon;
    }
    if (u.seed != LOWRANK_CONFIG_UNDEF_SEED) {
      if (u.seed < 0) return argError("seed", ">= 0");
      c.seed = uint64_t(u.seed);
    }
    if (u.timeoutSec != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.timeoutSec > 0) || !std::isfinite(u.timeoutSec)) return argError("timeoutSec", "> 0");
      c.timeoutSec = u.timeoutSec;
    }
    if (u.pipeline != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.pipeline != 0 && u.pipeline != 1) return argError("pipeline", "0 or 1");
      c.pipeline = u.pipeline;
    }
  }
  *out = c;
  return Status::Ok();
}

Status shimEnvFromEnv(ShimEnv* out) {
  ShimEnv e;
  LR_RETURN_IF_ERROR(envBool("LOWRANK_ENABLE", &e.enable));
  if (!e.enable) {  // the kill switch: nothing else is read, so nothing else can fail
    *out = e;
    return Status::Ok();
  }
  LR_RETURN_IF_ERROR(checkDebugEnv());
  LR_RETURN_IF_ERROR(envSeed("LOWRANK_MIN_BYTES", &e.minBytes));  // any non-negative integer
  LR_RETURN_IF_ERROR(envInt("LOWRANK_START_ITER", 0, 1 << 30, &e.startIter));
  *out = e;
  return Status::Ok();
}

void logConfig(const EngineConfig& c, int rank, int nranks) {
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", LOWRANK_MAJOR, LOWRANK_MINOR, LOWRANK_PATCH);
  logVersionOnce(v);
  LR_INFO("comm rank %d/%d: approxRank %d, minCompressionRate %g, startIter %d, errorFeedback %d, "
          "warmStart %d, orthoEpsilon %g, seed %llu, timeout %g s, pipeline %d (chunk %llu "
          "elements)",
          rank, nranks, c.approxRank, c.minCompressionRate, c.startIter, int(c.errorFeedback),
          int(c.warmStart), c.orthoEpsilon, (unsigned long long)c.seed, c.timeoutSec,
          int(c.pipeline), (unsigned long long)c.pipelineChunk);
}

}  // namespace lowrank::api
