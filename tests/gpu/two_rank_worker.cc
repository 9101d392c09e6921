// One comm rank of a multi-process device check over NCCL (run_device_checks.sh starts several,
// each with its own NCCL_HOSTID so that NCCL treats them as separate hosts even on one GPU).
//   two_rank_worker check RANK NRANKS IDFILE OUTFILE
//     exactness on a rank-k sum, agreement across ranks (OUTFILE, compared by the script),
//     mismatched counts refused on every rank; exits non-zero on any failure.
//   two_rank_worker bench RANK NRANKS IDFILE ELEMENTS K
//     pipelined time of a compressed allreduce vs compute alone (a one-rank communicator) and
//     communication alone (the same NCCL allreduces of the factors), and exact ncclAllReduce.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data.h"
#include "gpu/device_support.h"

using namespace lowrank::testing;

namespace {

int failures = 0;

lowrankConfig_t config(int k) {
  lowrankConfig_t c = LOWRANK_CONFIG_INITIALIZER;
  c.approxRank = k;
  c.timeoutSec = 60;
  return c;
}
#define CHECK(cond, ...)                                                     \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "rank %d: FAILED %s: ", rank, #cond);                 \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n");                                                \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

ncclComm_t joinNccl(int rank, int nranks, const std::string& idFile) {
  ncclUniqueId id;
  if (rank == 0) {
    ncclGetUniqueId(&id);
    std::string tmp = idFile + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof id.internal);
    rename(tmp.c_str(), idFile.c_str());
  } else {
    for (int i = 0; i < 600; ++i) {
      std::ifstream f(idFile, std::ios::binary);
      if (f && f.read(id.internal, sizeof id.internal)) break;
      usleep(100000);
    }
  }
  ncclComm_t c = nullptr;
  if (ncclCommInitRank(&c, nranks, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRank failed\n", rank);
    exit(2);
  }
  return c;
}

void barrier(ncclComm_t c, cudaStream_t s) {
  static float* d = nullptr;
  if (!d) cudaMalloc(&d, sizeof(float));
  ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
  cudaStreamSynchronize(s);
}

int check(int rank, int nranks, const std::string& idFile, const std::string& outFile) {
  ncclComm_t nccl = joinNccl(rank, nranks, idFile);
  lowrankComm_t comm = nullptr;
  lowrankConfig_t cfg = config(4);
  if (lowrankCommInitFromNcclConfig(&comm, nccl, &cfg) != lowrankSuccess) return 2;
  cudaStream_t s;
  cudaStreamCreate(&s);
  const size_t n = 512, m = 768, count = n * m;
  // Rank-k sum: every call's output is the exact sum.
  std::vector<float> sum(count, 0.f);
  for (int r = 0; r < nranks; ++r) {
    const std::vector<float> x = rankKInput(n, m, 4, r);
    for (size_t i = 0; i < count; ++i) sum[i] += x[i];
  }
  void* g = toDevice(rankKInput(n, m, 4, rank), lowrankFloat32);
  void* out = nullptr;
  cudaMalloc(&out, count * 4);
  size_t shape[2] = {n, m};
  const size_t* shapes[1] = {shape};
  int nd = 2;
  lowrankBufferSetLayout(comm, out, 1, &nd, shapes);
  for (int call = 0; call < 3; ++call) {
    lowrankResult_t r = lowrankAllReduce(g, out, count, lowrankFloat32, lowrankSum, comm, s);
    CHECK(r == lowrankSuccess, "call %d: %s", call, lowrankGetLastError(comm));
    cudaStreamSynchronize(s);
    const double e = relErr(fromDevice(out, count, lowrankFloat32), sum);
    CHECK(e < 1e-4, "call %d: rank-k sum relative error %.3g", call, e);
  }
  // A gradient-like input, pipelined in several chunks: written for the cross-rank comparison.
  setenv("LOWRANK_PIPELINE_CHUNK", "65536", 1);
  lowrankComm_t piped = nullptr;
  if (lowrankCommInitFromNcclConfig(&piped, nccl, &cfg) != lowrankSuccess) return 2;
  const size_t big = 1024 * 1024;
  void* d = toDevice(decayingInput(1024, 1024, rank), lowrankBfloat16);
  for (int call = 0; call < 3; ++call)
    CHECK(lowrankAllReduce(d, d, big, lowrankBfloat16, lowrankAvg, piped, s) == lowrankSuccess,
          "pipelined call %d: %s", call, lowrankGetLastError(piped));
  cudaStreamSynchronize(s);
  const std::vector<float> res = fromDevice(d, big, lowrankBfloat16);
  std::ofstream(outFile, std::ios::binary).write(reinterpret_cast<const char*>(res.data()), big * 4);
  lowrankBufferView_t view;
  lowrankBufferGetView(piped, d, &view);
  CHECK(view.chunks > 1, "expected several chunks, got %zu", size_t(view.chunks));
  // Mismatched counts: refused on every rank, and the communicator stays usable.
  void* mm = nullptr;
  cudaMalloc(&mm, 70000 * 4);
  cudaMemset(mm, 0, 70000 * 4);
  lowrankResult_t r = lowrankAllReduce(mm, mm, 60000 + rank, lowrankFloat32, lowrankSum, comm, s);
  CHECK(r == lowrankInvalidUsage, "mismatched counts gave %d: %s", int(r), lowrankGetLastError(comm));
  lowrankStats_t st;
  lowrankGetStats(comm, &st);
  CHECK(st.compressedCalls == 3, "compressedCalls %llu", (unsigned long long)st.compressedCalls);
  lowrankCommDestroy(piped);
  lowrankCommDestroy(comm);
  ncclCommDestroy(nccl);
  printf("rank %d: check %s\n", rank, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// Mean milliseconds of `reps` runs of f on stream s, after `warm` untimed runs.
template <typename F>
double timeIt(cudaStream_t s, int warm, int reps, F f) {
  for (int i = 0; i < warm; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}

int bench(int rank, int nranks, const std::string& idFile, size_t elems, int k) {
  ncclComm_t nccl = joinNccl(rank, nranks, idFile);
  ncclComm_t solo = nullptr;
  int dev = 0;
  ncclCommInitAll(&solo, 1, &dev);
  lowrankConfig_t cfg = config(k);
  lowrankComm_t comm = nullptr, alone = nullptr;
  lowrankCommInitFromNcclConfig(&comm, nccl, &cfg);
  lowrankCommInitFromNcclConfig(&alone, solo, &cfg);
  cudaStream_t s;
  cudaStreamCreate(&s);
  const size_t side = size_t(std::sqrt(double(elems)));
  std::vector<float> x = decayingInput(side, elems / side, rank);
  x.resize(elems, 0.01f);
  void* g = toDevice(x, lowrankFloat32);
  void* out = nullptr;
  cudaMalloc(&out, elems * 4);
  const int warm = 3, reps = 10;
  barrier(nccl, s);
  const double tExact = timeIt(s, warm, reps, [&] { ncclAllReduce(g, out, elems, ncclFloat32, ncclSum, nccl, s); });
  barrier(nccl, s);
  const double tPipe = timeIt(s, warm, reps, [&] { lowrankAllReduce(g, out, elems, lowrankFloat32, lowrankAvg, comm, s); });
  barrier(nccl, s);
  void* out2 = nullptr;
  cudaMalloc(&out2, elems * 4);
  const double tCompute = timeIt(s, warm, reps, [&] { lowrankAllReduce(g, out2, elems, lowrankFloat32, lowrankAvg, alone, s); });
  barrier(nccl, s);
  // Communication alone: the same factor allreduces, in the same number of chunks.
  lowrankBufferView_t v;
  lowrankBufferGetView(comm, out, &v);
  const size_t chunks = std::max<size_t>(1, v.chunks);
  float* f = nullptr;
  cudaMalloc(&f, (v.pElements + v.qElements + v.exactElements + 2) * 4);
  const double tComm = timeIt(s, warm, reps, [&] {
    if (v.exactElements) ncclAllReduce(f, f, v.exactElements, ncclFloat32, ncclSum, nccl, s);
    for (size_t c = 0; c < chunks; ++c) ncclAllReduce(f, f, v.pElements / chunks + 2, ncclFloat32, ncclSum, nccl, s);
    for (size_t c = 0; c < chunks; ++c) ncclAllReduce(f, f, v.qElements / chunks + 1, ncclFloat32, ncclSum, nccl, s);
  });
  barrier(nccl, s);
  lowrankStats_t st;
  lowrankGetStats(comm, &st);
  if (rank == 0) {
    const double bound = std::max(tCompute, tComm);
    printf("bench: %zu float32 elements (%.0f MB), k %d, %d ranks, %zu chunks, ratio %.1f\n", elems,
           elems * 4 / 1e6, k, nranks, chunks, st.ratio);
    printf("bench: exact ncclAllReduce %.3f ms | powersgd pipelined %.3f ms | compute alone %.3f ms "
           "| comm alone %.3f ms\n", tExact, tPipe, tCompute, tComm);
    printf("bench: pipelined / max(compute, comm) = %.3f (target <= 1.15); speedup vs exact %.2fx\n",
           tPipe / bound, tExact / tPipe);
  }
  lowrankCommDestroy(comm);
  lowrankCommDestroy(alone);
  ncclCommDestroy(solo);
  ncclCommDestroy(nccl);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s check RANK NRANKS IDFILE OUTFILE | bench RANK NRANKS IDFILE ELEMENTS K\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int rank = atoi(argv[2]), nranks = atoi(argv[3]);
  if (!noDevice().empty()) {
    fprintf(stderr, "rank %d: %s\n", rank, noDevice().c_str());
    return 77;
  }
  if (mode == "check" && argc == 6) return check(rank, nranks, argv[4], argv[5]);
  if (mode == "bench" && argc == 7) return bench(rank, nranks, argv[4], strtoull(argv[5], nullptr, 10), atoi(argv[6]));
  fprintf(stderr, "bad arguments\n");
  return 2;
}
