/* liblowrank's services to its plugins (the NCCL shim, the CUDA backend): the process's one
 * logging state and LOWRANK_* environment, the real NCCL, the CUDA probes and the dtype names, so
 * that no plugin compiles a second copy of them. Plain C and versioned: a plugin asks for the
 * version it was built with and gets NULL from a liblowrank that cannot serve it; fields are only
 * ever appended (`size`). Thread safety: the table is immutable; every entry is safe from any
 * thread. */
#ifndef LOWRANK_ABI_SERVICES_H_
#define LOWRANK_ABI_SERVICES_H_

#include <stddef.h>
#include <stdint.h>

#include "abi/real_nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWRANK_SERVICES_VERSION 3 /* 2: lowrankShimSettings_t lost startIter; 3: env */

/* Log levels, as LOWRANK_DEBUG names them. */
enum { lowrankLogNone = 0, lowrankLogWarn = 1, lowrankLogInfo = 2, lowrankLogTrace = 3 };

/* The NCCL shim's variables (docs/environment.md): LOWRANK_ENABLE (default 1), LOWRANK_MIN_BYTES
 * (bytes, default 1 MiB). */
typedef struct lowrankShimSettings {
  int enable;
  uint64_t minBytes;
} lowrankShimSettings_t;

typedef struct lowrankServices {
  uint32_t version; /* LOWRANK_SERVICES_VERSION of the liblowrank that made the table */
  uint32_t size;    /* sizeof(lowrankServices_t) there */

  /* Logging (plugin/util/log.h): the level parsed once per process from LOWRANK_DEBUG; a line in
   * NCCL's form to LOWRANK_DEBUG_FILE or stderr; the CUDA device shown in this thread's lines. */
  int (*logLevel)(void);
  void (*logWrite)(int level, const char* file, int line, const char* message);
  void (*setLogDevice)(int device);

  /* The shim's LOWRANK_* variables, parsed once per process: lowrankSuccess, or
   * lowrankInvalidUsage with *error naming the malformed variable (the text lives for the
   * process). */
  int (*shimSettings)(lowrankShimSettings_t* out, const char** error);

  /* The real NCCL (plugin/platform/nccl.h gives the order in which the library is found): the
   * table, or NULL with *error saying why (lives for the process). */
  const lowrankRealNccl_t* (*realNccl)(const char** error);

  /* CUDA probes (plugin/platform/cuda_probe.h), answered from the CUDA libraries the process has
   * loaded already; none loads CUDA. */
  int (*isDevicePointer)(const void* p);   /* 1: device (or managed) memory */
  int (*streamCapturing)(void* stream);    /* 1: the cudaStream_t is being captured */
  int (*deviceEnter)(int device);          /* makes `device` current; returns the previous one
                                            * to give deviceLeave, or -1 when nothing changed */
  void (*deviceLeave)(int previous);

  /* lowrank.h's dtype and op numbers (NCCL's): bytes per element (0: not a dtype), and the
   * names nccl-tests uses ("float", "half", ...; "sum", "avg", ...; "unknown"). */
  size_t (*dtypeSize)(int dtype);
  const char* (*dtypeName)(int dtype);
  const char* (*opName)(int op);

  /* The value of a variable of liblowrank's table of the environment (plugin/util/env.h), NULL
   * when unset or empty. */
  const char* (*env)(const char* name);
} lowrankServices_t;

/* The table of this liblowrank, or NULL when it cannot serve `version` (a plugin built from
 * another tree). Exported by liblowrank.so. */
const lowrankServices_t* lowrankGetServices(uint32_t version);

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_SERVICES_H_ */
