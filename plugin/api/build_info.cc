// lowrankGetBuildInfo: the source revision liblowrank was built from, for results' provenance. The
// values live in build_revision.c, which scripts/source_revision.py rewrites at every build only when
// they change: a new commit recompiles that file alone. Both are in liblowrank.so only (not in
// lowrank_core, which the tests link whole), so a commit relinks no test binary.
#include <lowrank/lowrank.h>

#include "api/export.h"

extern "C" {
extern const char lowrankBuildRevision[];
extern const int lowrankBuildSourcesDirty;
extern const char lowrankBuildSourcesDigest[];
}

LOWRANK_API lowrankResult_t lowrankGetBuildInfo(const char** revision, int* sourcesDirty,
                                                const char** sourcesDigest) {
  if (revision) *revision = lowrankBuildRevision;
  if (sourcesDirty) *sourcesDirty = lowrankBuildSourcesDirty;
  if (sourcesDigest) *sourcesDigest = lowrankBuildSourcesDigest;
  return lowrankSuccess;
}
