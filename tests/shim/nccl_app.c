/*
 * An ordinary NCCL program (nccl.h only, linked with -lnccl), for the shim's tests: one comm rank
 * per process, a few training-like iterations of allreduces on host buffers (the test double of
 * NCCL runs on host memory), every output written to a file for the driver (shim_test.py).
 *
 *   nccl_app SCENARIO RANK NRANKS IDFILE OUTPREFIX [--no-premul] [--no-release] [--no-destroy] [--no-hint] [--exit-at ITER]
 *
 * Built twice from this file: nccl_app (pure NCCL: run with and without LD_PRELOAD of the shim,
 * or with the drop-in libnccl.so.2) and nccl_app_direct (-DLOWRANK_DIRECT): the same program that
 * calls lowrank itself (lowrankCommInitFromNccl + lowrankAllReduce) for exactly the calls the
 * shim is documented to give lowrank, and ncclAllReduce for the rest: the reference the shim's
 * results must equal bit for bit. The schedule (where each call goes) is written by both into
 * OUTPREFIX.txt, so the driver knows which calls must differ from an exact allreduce.
 * The schedules assume LOWRANK_MIN_BYTES=65536 (threshold: 1 MiB) and the shim's detection: a
 * sequence goes to lowrank from its third repetition. Of those calls, lowrank does each buffer's
 * first LOWRANK_START_ITER (read here too, default 0) exactly, counted from the buffer's first call
 * on the communicator or since its state was released.
 *
 * Scenarios (buffers: G* eligible float buffers; I1 int32, M1 max, S1 small: ineligible):
 *   mixed      9 iterations of G1 (f32 avg, in-place), I1, G2 (bf16 sum, out-of-place), M1, S1,
 *              G3 (f16 premulsum 1/nranks, in-place); a one-off O1 (f32 sum) ends iteration 4.
 *              To lowrank: G1 G2 G3 at iterations 2-4 and 7-8 (the one-off breaks the sequence:
 *              NCCL again until it has repeated twice; the buffers keep their state).
 *   groups     5 iterations, XLA-like: every call inside ncclGroupStart/End (one group nested);
 *              compressed calls run after the outermost group end. To lowrank from iteration 2.
 *   change     10 iterations: [G1 G2] until iteration 4, then [G1 G4]: G1 and G2 lose their state
 *              (released) when the new sequence is adopted at iteration 7.
 *   destroy    [G1 G2] for 4 iterations on one communicator, finalized and destroyed, then the
 *              same on a new one (aborted at the end): the second starts afresh (detection, new
 *              state).
 *   layout     L1 (f32 avg, in-place) packs a 128x96 matrix, a 96-element bias and a 64x64 matrix;
 *              its layout is given to the shim (lowrankNcclSetBucketLayout, found with dlsym as a
 *              ctypes user would; --no-hint skips it) or, direct, to lowrankBufferSetLayout.
 *              To lowrank from iteration 2. Also records what a malformed hint returns. L2 (f32
 *              sum) gets a stale hint (its elements do not add up): ignored, it stays batched.
 *   threshold  B1 (f32, exactly 1 MiB) and B2 (1 MiB - 4 bytes), 4 iterations, default
 *              LOWRANK_MIN_BYTES: B1 to lowrank from iteration 2, B2 never.
 *
 * Output: OUTPREFIX.bin (the outputs, concatenated) and OUTPREFIX.txt, lines
 *   out ITER TAG KIND OFFSET BYTES           an output and where the schedule sends it: 0 the real
 *                                            NCCL, 1 lowrank compresses it, 2 lowrank, exactly
 *                                            (the buffer's warm-up, LOWRANK_START_ITER)
 *   deferred ITER TAG UNCHANGED              groups: was the buffer untouched when ncclAllReduce
 *                                            returned inside the group (the shim defers it)?
 *   hint GOOD BAD                            layout: the results of a valid and a malformed hint
 * Exit status 0, or 1 with a message naming the failed call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef LOWRANK_DIRECT
#include "lowrank/lowrank_nccl.h"
#endif

#define PREMUL (-1) /* op of G3: a premulsum with host scalar 1/nranks */

typedef struct {
  const char* tag;
  ncclDataType_t dtype;
  size_t count;
  int op; /* ncclRedOp_t, or PREMUL */
  int inPlace;
  void* send;
  void* recv;
  int lrCalls; /* calls given to lowrank since the buffer's state was made */
} Buf;

static int rank, nranks, noPremul, noRelease, noDestroy, noHint;
static int exitAt = -1; /* mixed: the last comm rank dies at the start of this iteration */
static int startIter;   /* LOWRANK_START_ITER: lowrank's exact calls per buffer */
static FILE *bin, *txt;
static long offset;
static ncclComm_t comm;
static ncclRedOp_t premulOp;
#ifdef LOWRANK_DIRECT
static lowrankComm_t lr;
#endif

static void die(const char* what, ncclResult_t r) {
  const char* last = ncclGetLastError(comm);
  fprintf(stderr, "nccl_app rank %d: %s failed: %s (%d): %s\n", rank, what,
          ncclGetErrorString(r), (int)r, last);
  /* A later error of NCCL's own, in a call the shim does not see, is then the last error: the
     shim's text must give way to it (and the pointer returned before must stay readable). */
  int n;
  ncclCommCount(NULL, &n);
  fprintf(stderr, "nccl_app rank %d: after a failed ncclCommCount: %s (before: %.40s)\n", rank,
          ncclGetLastError(comm), last);
  exit(1);
}
#define NCCLCHECK(call)                       \
  do {                                        \
    ncclResult_t r_ = (call);                 \
    if (r_ != ncclSuccess) die(#call, r_);    \
  } while (0)

static size_t dtypeSize(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 ? 2 : 4;
}

static uint16_t toBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static uint16_t toHalf(float f) { /* values here are normal and in range */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int exp = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (exp <= 0) return (uint16_t)sign;
  uint32_t h = sign | (uint32_t)(exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return (uint16_t)h;
}

/* Deterministic inputs: a rank-3 matrix (rows x 256) that every comm rank shares, scaled per
 * rank, plus noise; integers for int32. */
static uint64_t lcg(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}
static float unit(uint64_t* s) { return (float)((double)lcg(s) / (double)(1ull << 53)) * 2.f - 1.f; }

static void fill(Buf* b, int it, int salt) {
  uint64_t shared = 1000003ull * (uint64_t)(it + 1) + (uint64_t)salt * 7919ull;
  uint64_t own = shared ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1));
  const size_t cols = 256;
  float u[3] = {0, 0, 0}, v[3][256];
  for (int r = 0; r < 3; ++r)
    for (size_t j = 0; j < cols; ++j) v[r][j] = unit(&shared);
  void* dst = b->send;
  for (size_t i = 0; i < b->count; ++i) {
    if (i % cols == 0)
      for (int r = 0; r < 3; ++r) u[r] = unit(&shared);
    const size_t j = i % cols;
    float x = (1.f + 0.25f * (float)rank) * (u[0] * v[0][j] + 0.5f * u[1] * v[1][j] + 0.25f * u[2] * v[2][j]) +
              0.05f * unit(&own);
    switch (b->dtype) {
      case ncclFloat32: ((float*)dst)[i] = x; break;
      case ncclBfloat16: ((uint16_t*)dst)[i] = toBf16(x); break;
      case ncclFloat16: ((uint16_t*)dst)[i] = toHalf(x); break;
      case ncclInt32: ((int32_t*)dst)[i] = (int32_t)(lcg(&own) % 2001) - 1000; break;
      default: break;
    }
  }
}

static void* owned[32]; /* every buffer make() allocated: freed at the end of main */
static int nowned;

static Buf make(const char* tag, ncclDataType_t dtype, size_t count, int op, int inPlace) {
  Buf b = {tag, dtype, count, op, inPlace, NULL, NULL, 0};
  b.recv = aligned_alloc(64, (count * dtypeSize(dtype) + 63) / 64 * 64);
  b.send = inPlace ? b.recv : aligned_alloc(64, (count * dtypeSize(dtype) + 63) / 64 * 64);
  if (!b.recv || !b.send || nowned + 2 > (int)(sizeof owned / sizeof owned[0])) {
    fprintf(stderr, "nccl_app: out of memory\n");
    exit(1);
  }
  owned[nowned++] = b.recv;
  if (!inPlace) owned[nowned++] = b.send;
  return b;
}

/* ---- calls, groups and the record of outputs ---------------------------------------------- */

typedef struct {
  Buf* b;
  int it, kind; /* kind: as in OUTPREFIX.txt */
} Pending;
static Pending pending[64]; /* outputs to write (and direct-mode calls to run) at group end */
static int npending, depth;
static int iterOffset; /* added to the iteration in OUTPREFIX.txt only (destroy: second round) */

static void writeOut(Buf* b, int it, int kind) {
  const size_t bytes = b->count * dtypeSize(b->dtype);
  fprintf(txt, "out %d %s %d %ld %zu\n", it + iterOffset, b->tag, kind, offset, bytes);
  if (fwrite(b->recv, 1, bytes, bin) != bytes) {
    fprintf(stderr, "nccl_app: write failed\n");
    exit(1);
  }
  offset += (long)bytes;
}

#ifdef LOWRANK_DIRECT
static void lowrankCall(Buf* b) {
  const lowrankRedOp_t op = b->op == PREMUL ? lowrankAvg : (lowrankRedOp_t)b->op;
  lowrankResult_t r = lowrankAllReduce(b->send, b->recv, b->count, (lowrankDataType_t)b->dtype, op, lr, NULL);
  if (r != lowrankSuccess) {
    fprintf(stderr, "nccl_app rank %d: lowrankAllReduce(%s): %s: %s\n", rank, b->tag,
            lowrankGetErrorString(r), lowrankGetLastError(lr));
    exit(1);
  }
}
#endif

static void flush(void) {
  for (int i = 0; i < npending; ++i) {
#ifdef LOWRANK_DIRECT
    if (pending[i].kind) lowrankCall(pending[i].b);
#endif
    writeOut(pending[i].b, pending[i].it, pending[i].kind);
  }
  npending = 0;
}

static void groupStart(void) {
  NCCLCHECK(ncclGroupStart());
  ++depth;
}

static void groupEnd(void) {
  NCCLCHECK(ncclGroupEnd());
  if (--depth == 0) flush();
}

/* One allreduce of b at iteration it; `toLowrank`: the schedule says the shim gives it lowrank. */
static void allreduce(Buf* b, int it, int toLowrank) {
  fill(b, it, (int)b->tag[0] * 31 + (int)b->tag[1]);
  const ncclRedOp_t op = b->op == PREMUL ? premulOp : (ncclRedOp_t)b->op;
  const int kind = !toLowrank ? 0 : b->lrCalls++ < startIter ? 2 : 1;
  int direct = 0;
#ifdef LOWRANK_DIRECT
  direct = kind != 0;
#endif
  if (!direct) NCCLCHECK(ncclAllReduce(b->send, b->recv, b->count, b->dtype, op, comm, NULL));
  if (depth > 0 && b->inPlace) {  /* was the call deferred? (the double runs calls at once) */
    Buf ref = *b;
    ref.send = malloc(b->count * dtypeSize(b->dtype));
    ref.recv = ref.send;
    fill(&ref, it, (int)b->tag[0] * 31 + (int)b->tag[1]);
    fprintf(txt, "deferred %d %s %d\n", it + iterOffset, b->tag,
            memcmp(ref.send, b->recv, b->count * dtypeSize(b->dtype)) == 0);
    free(ref.send);
  }
  pending[npending].b = b;
  pending[npending].it = it;
  pending[npending].kind = kind;
  ++npending;
  if (depth == 0) flush();
}

/* ---- communicators -------------------------------------------------------------------------- */

static void sleepMs(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Comm rank 0 makes the id and writes it to `path` (atomically); the others wait for it. */
static ncclUniqueId shareId(const char* path) {
  ncclUniqueId id;
  if (rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "nccl_app: cannot write %s\n", path);
      exit(1);
    }
    return id;
  }
  for (int waited = 0; waited < 60000; waited += 20) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t n = fread(&id, sizeof id, 1, f);
      fclose(f);
      if (n == 1) return id;
    }
    sleepMs(20);
  }
  fprintf(stderr, "nccl_app rank %d: no unique id in %s after 60 s\n", rank, path);
  exit(1);
}

static void commInit(const char* idPath) {
  ncclUniqueId id = shareId(idPath);
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  if (!noPremul) { /* 1/nranks rounded to half, as a framework averaging in float16 passes it */
    uint16_t s = toHalf(1.f / (float)nranks);
    NCCLCHECK(ncclRedOpCreatePreMulSum(&premulOp, &s, ncclFloat16, ncclScalarHostImmediate, comm));
  }
#ifdef LOWRANK_DIRECT
  lowrankResult_t r = lowrankCommInitFromNccl(&lr, comm); /* as the shim: LOWRANK_* configure it */
  if (r != lowrankSuccess) {
    fprintf(stderr, "nccl_app: lowrankCommInitFromNccl: %s\n", lowrankGetLastError(NULL));
    exit(1);
  }
#endif
}

/* how: 'd' ncclCommDestroy, 'f' ncclCommFinalize then ncclCommDestroy, 'a' ncclCommAbort. */
static void commEnd(char how) {
#ifdef LOWRANK_DIRECT
  lowrankCommDestroy(lr);
  lr = NULL;
#endif
  if (!noPremul) NCCLCHECK(ncclRedOpDestroy(premulOp, comm));
  if (how == 'f') NCCLCHECK(ncclCommFinalize(comm));
  if (how == 'a') NCCLCHECK(ncclCommAbort(comm));
  else NCCLCHECK(ncclCommDestroy(comm));
}

/* The shim releases b here (the schedule's point); direct, lowrank is told unless --no-release. */
static void release(Buf* b) {
#ifdef LOWRANK_DIRECT
  if (noRelease) return;
  lowrankBufferRelease(lr, b->recv);
#endif
  b->lrCalls = 0; /* a released buffer starts afresh in lowrank, warm-up included */
}

/* ---- scenarios ------------------------------------------------------------------------------ */

static void mixed(void) {
  Buf g1 = make("G1", ncclFloat32, 128 * 256, ncclAvg, 1);
  Buf i1 = make("I1", ncclInt32, 128 * 256, ncclSum, 1);
  Buf g2 = make("G2", ncclBfloat16, 256 * 256, ncclSum, 0);
  Buf m1 = make("M1", ncclFloat32, 128 * 256, ncclMax, 1);
  Buf s1 = make("S1", ncclFloat32, 4 * 256, ncclSum, 1);
  Buf g3 = make("G3", ncclFloat16, 256 * 256, PREMUL, 1);
  Buf o1 = make("O1", ncclFloat32, 256 * 256, ncclSum, 1);
  for (int it = 0; it < 9; ++it) {
    const int c = (it >= 2 && it <= 4) || it >= 7;
    if (it == exitAt && rank == nranks - 1) _exit(3); /* a peer dies between two calls */
    allreduce(&g1, it, c);
    allreduce(&i1, it, 0);
    allreduce(&g2, it, c);
    allreduce(&m1, it, 0);
    allreduce(&s1, it, 0);
    if (!noPremul) allreduce(&g3, it, c);
    if (it == 4) allreduce(&o1, it, 0);
  }
}

static void groups(void) {
  Buf g1 = make("G1", ncclFloat32, 128 * 256, ncclAvg, 1);
  Buf i1 = make("I1", ncclInt32, 128 * 256, ncclSum, 1);
  Buf g2 = make("G2", ncclBfloat16, 256 * 256, ncclSum, 1);
  Buf m1 = make("M1", ncclFloat32, 128 * 256, ncclMax, 1);
  Buf g3 = make("G3", ncclFloat16, 256 * 256, PREMUL, 1);
  for (int it = 0; it < 5; ++it) {
    const int c = it >= 2;
    groupStart(); /* XLA: one call per group */
    allreduce(&g1, it, c);
    groupEnd();
    groupStart(); /* a group of several, one nested group inside */
    allreduce(&i1, it, 0);
    groupStart();
    allreduce(&g2, it, c);
    groupEnd();
    allreduce(&m1, it, 0);
    if (!noPremul) allreduce(&g3, it, c);
    groupEnd();
  }
}

static void change(void) {
  Buf g1 = make("G1", ncclFloat32, 128 * 256, ncclAvg, 1);
  Buf g2 = make("G2", ncclFloat32, 160 * 256, ncclAvg, 1);
  Buf g4 = make("G4", ncclFloat32, 200 * 256, ncclSum, 1);
  for (int it = 0; it < 10; ++it) {
    if (it < 5) {
      allreduce(&g1, it, it >= 2);
      allreduce(&g2, it, it >= 2);
    } else {
      if (it == 7) { /* the new sequence [G1 G4] is adopted: G1's and G2's state goes */
        release(&g1);
        release(&g2);
      }
      allreduce(&g1, it, it == 5 || it >= 7); /* it 5: G1 still matches the old sequence */
      allreduce(&g4, it, it >= 7);
    }
  }
}

static void destroy(const char* idPath) {
  Buf g1 = make("G1", ncclFloat32, 128 * 256, ncclAvg, 1);
  Buf g2 = make("G2", ncclBfloat16, 256 * 256, ncclSum, 0);
  char second[4096];
  snprintf(second, sizeof second, "%s.2", idPath);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      commEnd('f'); /* the first communicator is finalized, then destroyed */
      commInit(second);
      g1.lrCalls = g2.lrCalls = 0; /* a new lowrank communicator: no state */
      iterOffset = 10; /* the same inputs as the first round, recorded as iterations 10-13 */
    }
    for (int it = 0; it < 4; ++it) {
      allreduce(&g1, it, it >= 2);
      allreduce(&g2, it, it >= 2);
    }
  }
}

static void layout(void) {
  Buf l1 = make("L1", ncclFloat32, 128 * 96 + 96 + 64 * 64, ncclAvg, 1);
  Buf l2 = make("L2", ncclFloat32, 20000, ncclSum, 1);
  int ndims[] = {2, 1, 2};
  if (!noHint) {
#ifdef LOWRANK_DIRECT
    size_t s0[] = {128, 96}, s1[] = {96}, s2[] = {64, 64};
    const size_t* shapes[] = {s0, s1, s2};
    if (lowrankBufferSetLayout(lr, l1.recv, 3, ndims, shapes) != lowrankSuccess) {
      fprintf(stderr, "nccl_app: lowrankBufferSetLayout: %s\n", lowrankGetLastError(lr));
      exit(1);
    }
#else
    typedef int (*SetLayout)(const void*, int, const int*, const int64_t*);
    SetLayout set = (SetLayout)dlsym(RTLD_DEFAULT, "lowrankNcclSetBucketLayout");
    if (set) {
      int64_t shapes[] = {128, 96, 96, 64, 64};
      int bad[] = {9};
      const int good = set(l1.recv, 3, ndims, shapes);
      fprintf(txt, "hint %d %d\n", good, set(l1.recv, 1, bad, shapes));
      if (set(l2.recv, 3, ndims, shapes) != 0) exit(1); /* stale: 16480 elements, not 20000 */
    }
#endif
  }
  for (int it = 0; it < 6; ++it) {
    allreduce(&l1, it, it >= 2);
    allreduce(&l2, it, it >= 2);
  }
}

static void threshold(void) {
  Buf b1 = make("B1", ncclFloat32, 1 << 18, ncclAvg, 1);
  Buf b2 = make("B2", ncclFloat32, (1 << 18) - 1, ncclAvg, 1);
  for (int it = 0; it < 4; ++it) {
    allreduce(&b1, it, it >= 2);
    allreduce(&b2, it, 0);
  }
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s SCENARIO RANK NRANKS IDFILE OUTPREFIX [--no-premul] [--no-release] [--no-destroy] [--no-hint] [--exit-at ITER]\n", argv[0]);
    return 2;
  }
  const char* scenario = argv[1];
  const char* si = getenv("LOWRANK_START_ITER");
  startIter = si ? atoi(si) : 0;
  rank = atoi(argv[2]);
  nranks = atoi(argv[3]);
  for (int i = 6; i < argc; ++i) {
    if (!strcmp(argv[i], "--no-premul")) noPremul = 1;
    else if (!strcmp(argv[i], "--no-release")) noRelease = 1;
    else if (!strcmp(argv[i], "--no-destroy")) noDestroy = 1;
    else if (!strcmp(argv[i], "--no-hint")) noHint = 1;
    else if (!strcmp(argv[i], "--exit-at") && i + 1 < argc) exitAt = atoi(argv[++i]);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s.bin", argv[5]);
  bin = fopen(path, "wb");
  snprintf(path, sizeof path, "%s.txt", argv[5]);
  txt = fopen(path, "w");
  if (!bin || !txt) {
    fprintf(stderr, "nccl_app: cannot open %s\n", path);
    return 1;
  }
  commInit(argv[4]);
  if (!strcmp(scenario, "mixed")) mixed();
  else if (!strcmp(scenario, "groups")) groups();
  else if (!strcmp(scenario, "change")) change();
  else if (!strcmp(scenario, "destroy")) destroy(argv[4]);
  else if (!strcmp(scenario, "threshold")) threshold();
  else if (!strcmp(scenario, "layout")) layout();
  else {
    fprintf(stderr, "nccl_app: unknown scenario %s\n", scenario);
    return 2;
  }
  if (!noDestroy) commEnd(!strcmp(scenario, "destroy") ? 'a' : 'd'); /* destroy: aborted */
  while (nowned) free(owned[--nowned]);
  fclose(bin);
  fclose(txt);
  return 0;
}
