// Messages of the shim in lowrank's (NCCL's) log form, "host:pid:tid LOWRANK INFO NCCL shim: ...",
// written through liblowrank's services (one logging state per process). SHIM_INFO/SHIM_TRACE
// follow LOWRANK_DEBUG; SHIM_ERROR is always printed: a failure the user must see (a bad variable,
// a failed compressed allreduce) is never silent, and it is what ncclGetLastError then returns on
// that thread (nccl_shim/last_error.h).
#pragma once
#include "abi/plugin_log.h"
#include "nccl_shim/last_error.h"

#define SHIM_INFO(fmt, ...) LR_INFO("NCCL shim: " fmt, ##__VA_ARGS__)
#define SHIM_TRACE(fmt, ...) LR_TRACE("NCCL shim: " fmt, ##__VA_ARGS__)
#define SHIM_ERROR(fmt, ...) ::lowrank::shim::reportError(__FILE__, __LINE__, fmt, ##__VA_ARGS__)
