// Logging in NCCL's form: "host:pid:tid [dev] LOWRANK INFO message", chosen by LOWRANK_DEBUG
// (WARN | INFO | TRACE; unset = nothing) and written to LOWRANK_DEBUG_FILE (%h = host, %p = pid)
// or stderr. Thread-safe.
#pragma once

namespace lowrank {

enum class LogLevel { None = 0, Warn = 1, Info = 2, Trace = 3 };

LogLevel logLevel();  // parsed once from LOWRANK_DEBUG
// The CUDA device shown as "[dev]" in this thread's lines, as NCCL does; -1 (default): none.
// Each shared object that compiles this file (liblowrank, the CUDA backend, the shim) keeps its own.
void setLogDevice(int device);

// "lowrank version X.Y.Z", once per process, when LOWRANK_DEBUG is VERSION, WARN, INFO or TRACE
// (NCCL prints its version at NCCL_DEBUG=VERSION and above). Called when a communicator is made.
void logVersionOnce(const char* version);

void logPrint(LogLevel level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace lowrank

#define LR_LOG(lvl, ...)                                                          \
  do {                                                                            \
    if (::lowrank::logLevel() >= (lvl)) ::lowrank::logPrint((lvl), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define LR_WARN(...) LR_LOG(::lowrank::LogLevel::Warn, __VA_ARGS__)
#define LR_INFO(...) LR_LOG(::lowrank::LogLevel::Info, __VA_ARGS__)
#define LR_TRACE(...) LR_LOG(::lowrank::LogLevel::Trace, __VA_ARGS__)
