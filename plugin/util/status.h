// Internal result type: a lowrankResult_t plus a message, returned by every fallible internal call.
// The API layer turns it into the C result code and the last-error string; no exception crosses it.
#pragma once
#include <cstdarg>
#include <string>

#include "lowrank/lowrank.h"

namespace lowrank {

struct Status {
  lowrankResult_t code = lowrankSuccess;
  std::string msg;
  // Every comm rank returns this error at the same point, before any data moved (a decision of
  // the plan check): it fails the call, not the communicator.
  bool agreed = false;

  bool ok() const { return code == lowrankSuccess; }
  static Status Ok() { return {}; }
  // printf-style message; also logged at WARN.
  static Status Error(lowrankResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
};

// Propagate a non-ok Status to the caller.
#define LR_RETURN_IF_ERROR(expr)           \
  do {                                     \
    ::lowrank::Status _st = (expr);        \
    if (!_st.ok()) return _st;             \
  } while (0)

}  // namespace lowrank
