// Turning internal Status into the C API's result codes and last-error strings, and the guard
// that keeps C++ exceptions from crossing the C API.
#pragma once
#include <new>
#include <string>

#include "api/comm.h"
#include "util/status.h"

namespace lowrank::api {

// Records the error (on comm, or the calling thread when comm is null) and returns its code.
lowrankResult_t fail(lowrankComm* comm, const Status& s);
lowrankResult_t fail(lowrankComm* comm, lowrankResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Runs f() -> lowrankResult_t, mapping any exception to an error code.
template <typename F>
lowrankResult_t guarded(lowrankComm* comm, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(comm, lowrankSystemError, "out of memory");
  } catch (const std::exception& e) {
    return fail(comm, lowrankInternalError, "unexpected exception: %s", e.what());
  } catch (...) {
    return fail(comm, lowrankInternalError, "unexpected exception");
  }
}

}  // namespace lowrank::api
