/* liblowrank's services to its plugins (the NCCL shim, the CUDA backend): the process's one
 * logging state and LOWRANK_* environment, and the other common parts, so that no plugin compiles
 * a second copy of them. Plain C and versioned: a plugin asks for the version it was built with
 * and gets NULL from a liblowrank that cannot serve it; fields are only ever appended (`size`).
 * Thread safety: the table is immutable; every entry is safe from any thread. */
#ifndef LOWRANK_ABI_SERVICES_H_
#define LOWRANK_ABI_SERVICES_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOWRANK_SERVICES_VERSION 1

/* Log levels, as LOWRANK_DEBUG names them. */
enum { lowrankLogNone = 0, lowrankLogWarn = 1, lowrankLogInfo = 2, lowrankLogTrace = 3 };

typedef struct lowrankServices {
  uint32_t version; /* LOWRANK_SERVICES_VERSION of the liblowrank that made the table */
  uint32_t size;    /* sizeof(lowrankServices_t) there */

  /* Logging (plugin/util/log.h): the level parsed once per process from LOWRANK_DEBUG; a line in
   * NCCL's form to LOWRANK_DEBUG_FILE or stderr; the CUDA device shown in this thread's lines. */
  int (*logLevel)(void);
  void (*logWrite)(int level, const char* file, int line, const char* message);
  void (*setLogDevice)(int device);
} lowrankServices_t;

/* The table of this liblowrank, or NULL when it cannot serve `version` (a plugin built from
 * another tree). Exported by liblowrank.so. */
const lowrankServices_t* lowrankGetServices(uint32_t version);

#ifdef __cplusplus
}
#endif

#endif /* LOWRANK_ABI_SERVICES_H_ */
