// The environment lowrank reads, in one table (env.cc), and the parsers of its LOWRANK_* variables,
// the one place their syntax is defined: a malformed value is lowrankInvalidUsage naming the
// variable, its value and what was expected. Each parser leaves *out alone when the variable is
// unset or empty. Nothing else in plugin/ reads the environment (scripts/check_layers.py); the
// plugins ask through lowrankServices_t.env. docs/environment.md's tables are made from the table
// (tests/env_doc: the test env_doc fails when they differ).
// Thread safety: reads the environment (getenv); callers parse once per process or per call.
#pragma once
#include <climits>
#include <cstdint>
#include <span>

#include "util/status.h"

namespace lowrank::env {

// A variable and its row of docs/environment.md: the table `section` names ("": read but
// documented in another's row: the launchers' own variables).
struct Variable {
  const char* name;
  const char* section = "";
  const char* values = "";
  const char* byDefault = "";
  const char* meaning = "";
};
std::span<const Variable> table();
// The value of `name`, null when unset or empty. A name not in the table aborts the process (a
// variable read but not documented).
const char* get(const char* name);

Status integer(const char* name, long lo, long hi, int* out);  // decimal, in [lo, hi]
// A finite number >= lo (> lo when loOpen).
Status number(const char* name, double lo, bool loOpen, double* out);
Status boolean(const char* name, bool* out);  // 0/1, true/false, yes/no, on/off
// One of names[0..count) (any case); *out = its index.
Status choice(const char* name, const char* const* names, int count, int* out);
// Decimal digits only, in [0, max] (no sign, no octal, no hexadecimal).
Status unsignedInteger(const char* name, uint64_t* out, unsigned long long max = ULLONG_MAX);
// LOWRANK_DEBUG is one of NONE, VERSION, WARN, INFO, TRACE (any case) when set.
Status checkDebug();

// The NCCL shim's variables (docs/environment.md): LOWRANK_ENABLE (boolean, default 1) and
// LOWRANK_MIN_BYTES (bytes, default 1 MiB). The shim reads them through liblowrank's services
// (lowrankServices_t.shimSettings), parsed once.
struct ShimEnv {
  bool enable = true;
  uint64_t minBytes = uint64_t(1) << 20;
};
Status shimEnv(ShimEnv* out);

}  // namespace lowrank::env
