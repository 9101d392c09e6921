// Messages of the shim in lowrank's (NCCL's) log form, "host:pid:tid LOWRANK INFO NCCL shim: ...".
// SHIM_INFO/SHIM_TRACE follow LOWRANK_DEBUG; SHIM_ERROR is always printed: a failure the user must
// see (a bad variable, a failed compressed allreduce) is never silent.
#pragma once
#include "util/log.h"

#define SHIM_INFO(fmt, ...) LR_INFO("NCCL shim: " fmt, ##__VA_ARGS__)
#define SHIM_TRACE(fmt, ...) LR_TRACE("NCCL shim: " fmt, ##__VA_ARGS__)
#define SHIM_ERROR(fmt, ...)                                                                  \
  ::lowrank::logPrint(::lowrank::LogLevel::Warn, __FILE__, __LINE__, "NCCL shim: " fmt,      \
                      ##__VA_ARGS__)
