// Fuzz target: the LOWRANK_* variables (plugin/api/config.cc), for the engine and for the NCCL
// shim. Each input sets some variables to strings (numbers, words, bytes) and unsets the others.
// Checks: a value is accepted only if it parses in full to a value in its documented range, which
// is then the value in force; a rejected one gives lowrankInvalidUsage naming the variable and
// quoting the value.
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/config.h"
#include "util/env.h"
#include "util/log.h"
#include "tests/fuzz/fuzz_input.h"

using namespace lowrank;

namespace {

constexpr const char* kName = "config";
#define CHECK(cond) FUZZ_CHECK(kName, cond, #cond)

const char* const kVars[] = {
    "LOWRANK_APPROX_RANK", "LOWRANK_MIN_COMPRESSION_RATE", "LOWRANK_START_ITER",
    "LOWRANK_ERROR_FEEDBACK", "LOWRANK_WARM_START", "LOWRANK_ORTHO_EPSILON", "LOWRANK_SEED",
    "LOWRANK_TIMEOUT", "LOWRANK_PIPELINE", "LOWRANK_PIPELINE_CHUNK", "LOWRANK_TEST_FAIL_ALLOC",
    "LOWRANK_ENABLE", "LOWRANK_MIN_BYTES", "LOWRANK_DEBUG"};
const char* const kWords[] = {"0", "1", "-1", "4", "+4", " 4", "4 ", "010", "0x10", "1e3", "2.5",
                              "inf", "nan", "true", "FALSE", "yes", "off", "on", "maybe", "",
                              "65536", "65537", "1073741824", "18446744073709551616", "WARN",
                              "info", "VERSION", "-0", "1e-300", "4294967297"};

std::string value(fuzz::Input& in) {
  switch (in.range(0, 2)) {
    case 0: return kWords[in.range(0, sizeof kWords / sizeof kWords[0] - 1)];
    case 1: return std::to_string(int64_t(in.u64()) >> in.range(0, 63));
    default: return in.text(12);
  }
}

// The reference parsers: what the documentation promises, written apart from config.cc.
bool refInt(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end;
  errno = 0;
  const long x = std::strtol(s.c_str(), &end, 10);
  *out = x;
  return !errno && !*end && x >= lo && x <= hi;
}
bool refDouble(const std::string& s, double lo, bool open, double* out) {
  char* end;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  *out = x;
  return !s.empty() && !errno && !*end && std::isfinite(x) && x >= lo && !(open && x == lo);
}
bool refDecimal(const std::string& s, uint64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return !errno;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The log level is read from LOWRANK_DEBUG once, at the first message: before any input sets it.
  static const LogLevel level = logLevel();
  (void)level;
  fuzz::Input in(data, size);
  std::string set[sizeof kVars / sizeof kVars[0]];
  bool isSet[sizeof kVars / sizeof kVars[0]] = {};
  // putenv of fixed buffers, rewritten in place: setenv would keep every distinct value for the
  // life of the process (glibc), a leak over millions of inputs.
  static char entry[sizeof kVars / sizeof kVars[0]][128];
  for (size_t i = 0; i < sizeof kVars / sizeof kVars[0]; ++i) {
    if (in.byte() < 64) {
      set[i] = value(in);
      isSet[i] = true;
      std::snprintf(entry[i], sizeof entry[i], "%s=%s", kVars[i], set[i].c_str());
      putenv(entry[i]);
    } else {
      unsetenv(kVars[i]);
    }
  }
  auto given = [&](const char* var) -> const std::string* {  // set and not empty (empty = unset)
    for (size_t i = 0; i < sizeof kVars / sizeof kVars[0]; ++i)
      if (!strcmp(kVars[i], var)) return isSet[i] && !set[i].empty() ? &set[i] : nullptr;
    return nullptr;
  };
  auto namesABadOne = [&](const Status& st) {
    if (st.code != lowrankInvalidUsage) return false;
    for (size_t i = 0; i < sizeof kVars / sizeof kVars[0]; ++i)
      if (isSet[i] && st.msg.find(std::string(kVars[i]) + "=\"" + set[i] + "\"") != std::string::npos)
        return true;
    return false;
  };

  EngineConfig cfg;
  const Status st = api::resolveConfig(nullptr, &cfg);
  if (!st.ok()) {
    CHECK(namesABadOne(st));
  } else {
    long l;
    double d;
    uint64_t u;
    if (const std::string* v = given("LOWRANK_APPROX_RANK"))
      CHECK(refInt(*v, 0, 1 << 16, &l) && cfg.approxRank == l);
    if (const std::string* v = given("LOWRANK_START_ITER"))
      CHECK(refInt(*v, 0, 1 << 30, &l) && cfg.startIter == l);
    if (const std::string* v = given("LOWRANK_PIPELINE_CHUNK"))
      CHECK(refInt(*v, 1, 1 << 30, &l) && cfg.pipelineChunk == uint64_t(l));
    if (const std::string* v = given("LOWRANK_TEST_FAIL_ALLOC"))
      CHECK(refInt(*v, -1, 1 << 30, &l) && cfg.testFailAllocRank == l);
    if (const std::string* v = given("LOWRANK_MIN_COMPRESSION_RATE"))
      CHECK(refDouble(*v, 1, false, &d) && cfg.minCompressionRate == d);
    if (const std::string* v = given("LOWRANK_ORTHO_EPSILON"))
      CHECK(refDouble(*v, 0, false, &d) && cfg.orthoEpsilon == d);
    if (const std::string* v = given("LOWRANK_TIMEOUT"))
      CHECK(refDouble(*v, 0, true, &d) && cfg.timeoutSec == d);
    if (const std::string* v = given("LOWRANK_SEED"))
      CHECK(refDecimal(*v, &u) && u <= uint64_t(LLONG_MAX) && cfg.seed == u);
    CHECK(cfg.approxRank >= 0 && cfg.minCompressionRate >= 1 && cfg.timeoutSec > 0 &&
          std::isfinite(cfg.timeoutSec) && cfg.pipelineChunk >= 1 && cfg.orthoEpsilon >= 0);
  }

  env::ShimEnv shim;
  const Status ss = env::shimEnv(&shim);
  if (!ss.ok()) {
    CHECK(namesABadOne(ss));
  } else if (shim.enable) {
    uint64_t u;
    if (const std::string* v = given("LOWRANK_MIN_BYTES")) CHECK(refDecimal(*v, &u) && shim.minBytes == u);
  }
  return 0;
}
