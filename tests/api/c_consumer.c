/* The public header is plain C (no CUDA, no C++): this program is compiled as C99 with warnings as
 * errors, and checks a one-rank allreduce, the config initializer and the build info through the
 * C ABI. */
#include <lowrank/lowrank.h>
#include <stdio.h>

int main(void) {
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  lowrankUniqueId id;
  lowrankComm_t comm;
  float x[256];
  int i, version = 0;
  const char* revision = NULL;
  if (cfg.size != sizeof(lowrankConfig_t) || cfg.magic != LOWRANK_CONFIG_MAGIC) return 1;
  if (lowrankGetVersion(&version) != lowrankSuccess || version != LOWRANK_VERSION_CODE) return 2;
  if (lowrankGetBuildInfo(&revision, NULL, NULL) != lowrankSuccess || !revision) return 8;
  cfg.approxRank = 2;
  if (lowrankGetUniqueId(&id) != lowrankSuccess) return 3;
  if (lowrankCommInitRankConfig(&comm, 1, id, 0, &cfg) != lowrankSuccess) return 4;
  for (i = 0; i < 256; ++i) x[i] = (float)(i % 16) * (float)(i / 16); /* rank 1: exact at k = 2 */
  if (lowrankAllReduce(x, x, 256, lowrankFloat32, lowrankAvg, comm, NULL) != lowrankSuccess) return 5;
  for (i = 0; i < 256; ++i) {
    float want = (float)(i % 16) * (float)(i / 16), d = x[i] - want;
    if (d > 1e-3f || d < -1e-3f) {
      fprintf(stderr, "element %d: %g, want %g\n", i, x[i], want);
      return 6;
    }
  }
  if (lowrankCommDestroy(comm) != lowrankSuccess) return 7;
  return 0;
}
