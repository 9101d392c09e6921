#include "api/errors.h"

#include <cstdarg>
#include <cstdio>

#include "api/export.h"
#include "util/c_enum.h"

namespace lowrank::api {
namespace {
thread_local std::string threadLastError;
}

lowrankResult_t fail(lowrankComm* comm, const Status& s) {
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->errMu);
    comm->lastError = s.msg;
  } else {
    threadLastError = s.msg;
  }
  return s.code;
}

lowrankResult_t fail(lowrankComm* comm, lowrankResult_t code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return fail(comm, Status::Error(code, "%s", buf));
}

}  // namespace lowrank::api

LOWRANK_API const char* lowrankGetErrorString(lowrankResult_t r) {
  switch (lowrank::cEnumValue(r)) {  // any int may come from C
    case lowrankSuccess: return "no error";
    case lowrankUnhandledCudaError: return "unhandled cuda error (lowrankGetLastError has the details)";
    case lowrankSystemError: return "unhandled system error (lowrankGetLastError has the details)";
    case lowrankInternalError: return "internal error - please report this issue to the lowrank developers";
    case lowrankInvalidArgument: return "invalid argument (lowrankGetLastError has the details)";
    case lowrankInvalidUsage: return "invalid usage (lowrankGetLastError has the details)";
    case lowrankRemoteError: return "remote process exited or there was a network error";
    case lowrankInProgress: return "operation in progress";
    case lowrankTimeout: return "timeout waiting for a peer (see LOWRANK_TIMEOUT)";
    default: return "unknown result code";
  }
}

LOWRANK_API const char* lowrankGetLastError(lowrankComm_t comm) {
  if (!comm) return lowrank::api::threadLastError.c_str();
  // Copied out under the lock, so another thread's error cannot tear the string we return.
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(comm->errMu);
  copy = comm->lastError;
  return copy.c_str();
}

LOWRANK_API lowrankResult_t lowrankGetVersion(int* version) {
  if (!version) return lowrank::api::fail(nullptr, lowrankInvalidArgument, "lowrankGetVersion: version is NULL");
  *version = LOWRANK_VERSION_CODE;
  return lowrankSuccess;
}
