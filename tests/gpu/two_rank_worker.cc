// One comm rank of a multi-process device check over NCCL (two_rank_check.sh starts two, each
// with its own NCCL_HOSTID so that NCCL treats them as separate hosts even on one GPU; built
// against the CPU emulation of CUDA and the NCCL test double, the same check runs in CI).
//   two_rank_worker check RANK NRANKS IDFILE OUTFILE
//     exactness on a rank-k sum; the device engine against the host engine call after call;
//     non-finite input on one comm rank and comm ranks that disagree on the op rejected on every
//     rank without poisoning the state; agreement across ranks (OUTFILE, compared by the script);
//     mismatched counts refused on every rank; a checkpoint restored into new communicators goes
//     on bit for bit, and a restore on one rank only is refused on both; exits non-zero on any
//     failure.
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
#include <cstring>
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

// Comm rank 0 makes the unique id (make(&id)) and writes it to idFile; the others read it.
template <typename Id, typename Make>
Id shareId(int rank, const std::string& idFile, Make make) {
  Id id;
  if (rank == 0) {
    make(&id);
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
  return id;
}

ncclComm_t joinNccl(int rank, int nranks, const std::string& idFile) {
  const ncclUniqueId id = shareId<ncclUniqueId>(rank, idFile, [](ncclUniqueId* i) { ncclGetUniqueId(i); });
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

// The device engine ran recv's calls (a device plan has chunks even unpipelined) and the comm has
// made `compressed` compressed calls in all.
void checkDeviceEngineRan(int rank, lowrankComm_t comm, const void* recv, uint64_t compressed) {
  lowrankBufferView_t view;
  lowrankBufferGetView(comm, recv, &view);
  CHECK(view.planned == 1 && view.chunks >= 1, "not a device plan: planned %d, %zu chunks",
        view.planned, size_t(view.chunks));
  lowrankStats_t st;
  lowrankGetStats(comm, &st);
  CHECK(st.compressedCalls == compressed && st.stateBytes > 0, "compressedCalls %llu (want %llu), state %llu bytes",
        (unsigned long long)st.compressedCalls, (unsigned long long)compressed, (unsigned long long)st.stateBytes);
}

// The device engine against the host engine (a host communicator over UCX), two comm ranks, a
// gradient-like float32 input: every call's output within 1e-4 of the host engine's.
void deviceVsHost(int rank, int nranks, const std::string& idFile, const lowrankConfig_t& cfg,
                  lowrankComm_t comm, cudaStream_t s) {
  const lowrankUniqueId id = shareId<lowrankUniqueId>(rank, idFile + ".host", [](lowrankUniqueId* i) {
    lowrankGetUniqueId(i);
  });
  lowrankConfig_t hostCfg = cfg;
  lowrankComm_t host = nullptr;
  if (lowrankCommInitRankConfig(&host, nranks, id, rank, &hostCfg) != lowrankSuccess) {
    CHECK(false, "host communicator: %s", lowrankGetLastError(nullptr));
    return;
  }
  const size_t n = 384, m = 320, count = n * m;
  std::vector<float> x = decayingInput(n, m, rank), hostOut(count);
  void* g = toDevice(x, lowrankFloat32);
  void* out = nullptr;
  cudaMalloc(&out, count * 4);
  for (int call = 0; call < 3; ++call) {
    CHECK(lowrankAllReduce(x.data(), hostOut.data(), count, lowrankFloat32, lowrankAvg, host, nullptr) ==
              lowrankSuccess, "host call %d: %s", call, lowrankGetLastError(host));
    CHECK(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, comm, s) == lowrankSuccess,
          "device call %d: %s", call, lowrankGetLastError(comm));
    cudaStreamSynchronize(s);
    const double e = relErr(fromDevice(out, count, lowrankFloat32), hostOut);
    CHECK(e < 1e-4, "call %d: device vs host engine, relative difference %.3g", call, e);
  }
  lowrankCommDestroy(host);
  cudaFree(g);
  cudaFree(out);
}

// One call on a planned buffer that the device must reject on every comm rank (this rank's input
// g and op): output all NaN. Then a good call: exact again (the state was not poisoned).
void rejectedThenExact(int rank, lowrankComm_t comm, cudaStream_t s, void* g, lowrankRedOp_t op,
                       void* good, void* out, size_t count, const std::vector<float>& sum,
                       const char* what) {
  CHECK(lowrankAllReduce(g, out, count, lowrankFloat32, op, comm, s) == lowrankSuccess, "%s: %s",
        what, lowrankGetLastError(comm));
  cudaStreamSynchronize(s);
  const std::vector<float> r = fromDevice(out, count, lowrankFloat32);
  const size_t nan = size_t(std::count_if(r.begin(), r.end(), [](float v) { return std::isnan(v); }));
  CHECK(nan == count, "%s: %zu of %zu outputs NaN, want all", what, nan, count);
  CHECK(lowrankAllReduce(good, out, count, lowrankFloat32, lowrankSum, comm, s) == lowrankSuccess,
        "%s, next call: %s", what, lowrankGetLastError(comm));
  cudaStreamSynchronize(s);
  const double e = relErr(fromDevice(out, count, lowrankFloat32), sum);
  CHECK(e < 1e-4, "%s, next call: rank-k sum relative error %.3g", what, e);
}

void checkpoint(int rank, int nranks, const std::string& idFile);

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
  uint64_t compressed = 3;
  checkDeviceEngineRan(rank, comm, out, compressed);
  // Rejected calls: non-finite input on comm rank 1 only; comm ranks that disagree on the op.
  std::vector<float> bad = rankKInput(n, m, 4, rank);
  if (rank == 1) bad[123] = NAN;
  void* gb = toDevice(bad, lowrankFloat32);
  rejectedThenExact(rank, comm, s, gb, lowrankSum, g, out, count, sum, "non-finite input on comm rank 1");
  rejectedThenExact(rank, comm, s, g, rank == 0 ? lowrankSum : lowrankAvg, g, out, count, sum,
                    "sum on comm rank 0, avg on 1");
  cudaFree(gb);
  compressed += 4;
  lowrankStats_t rejected;
  lowrankGetStats(comm, &rejected);
  CHECK(rejected.fallbackCalls == 2, "fallbackCalls %llu, want the 2 rejected calls",
        (unsigned long long)rejected.fallbackCalls);
  deviceVsHost(rank, nranks, idFile, cfg, comm, s);
  compressed += 3;
  checkDeviceEngineRan(rank, comm, out, compressed);
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
  checkDeviceEngineRan(rank, comm, out, compressed);
  lowrankCommDestroy(piped);
  lowrankCommDestroy(comm);
  ncclCommDestroy(nccl);
  checkpoint(rank, nranks, idFile);
  printf("rank %d: check %s\n", rank, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// Checkpoint across communicators (lowrankBufferSaveState / RestoreState): 20 calls, save, every
// communicator destroyed, new NCCL and lowrank communicators, restore, 20 calls: outputs the same
// bits as 40 calls without a stop; then a restore on comm rank 0 only is refused on every rank.
void checkpoint(int rank, int nranks, const std::string& idFile) {
  const size_t count = 96 * 128;
  const lowrankConfig_t cfg = config(3);
  // One session: a fresh NCCL communicator (its id file per tag), a lowrank one, a device buffer.
  auto session = [&](const char* tag, auto body) {
    ncclComm_t nccl = joinNccl(rank, nranks, idFile + tag);
    lowrankConfig_t c = cfg;
    lowrankComm_t comm = nullptr;
    lowrankCommInitFromNcclConfig(&comm, nccl, &c);
    cudaStream_t s;
    cudaStreamCreate(&s);
    void* out = nullptr;
    cudaMalloc(&out, count * 4);
    body(comm, out, s);
    lowrankBufferRelease(comm, out);
    cudaFree(out);
    cudaStreamDestroy(s);
    lowrankCommDestroy(comm);
    ncclCommDestroy(nccl);
    if (rank == 0) unlink((idFile + tag).c_str());
  };
  auto calls = [&](lowrankComm_t comm, void* out, cudaStream_t s, int from, int to,
                   std::vector<std::vector<float>>* outs) {
    for (int t = from; t < to; ++t) {
      void* g = toDevice(gaussian(count, 1000u * t + rank), lowrankFloat32);
      const lowrankResult_t r = lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, comm, s);
      CHECK(r == lowrankSuccess, "checkpoint call %d: %s", t, lowrankGetLastError(comm));
      cudaStreamSynchronize(s);
      if (outs) outs->push_back(fromDevice(out, count, lowrankFloat32));
      cudaFree(g);
    }
  };
  auto save = [&](lowrankComm_t comm, void* out) {
    size_t size = 0;
    lowrankBufferSaveState(comm, out, nullptr, &size);
    std::vector<char> b(size);
    CHECK(lowrankBufferSaveState(comm, out, b.data(), &size) == lowrankSuccess, "save: %s",
          lowrankGetLastError(comm));
    return b;
  };
  std::vector<std::vector<float>> straight, resumed;
  std::vector<char> saved;
  session(".ckpt0", [&](lowrankComm_t comm, void* out, cudaStream_t s) {
    calls(comm, out, s, 0, 40, &straight);
  });
  session(".ckpt1", [&](lowrankComm_t comm, void* out, cudaStream_t s) {
    calls(comm, out, s, 0, 20, nullptr);
    saved = save(comm, out);
  });
  session(".ckpt2", [&](lowrankComm_t comm, void* out, cudaStream_t s) {
    CHECK(lowrankBufferRestoreState(comm, out, saved.data(), saved.size()) == lowrankSuccess,
          "restore: %s", lowrankGetLastError(comm));
    calls(comm, out, s, 20, 40, &resumed);
  });
  bool same = resumed.size() == 20 && straight.size() == 40;
  for (size_t t = 0; same && t < 20; ++t) same = resumed[t] == straight[20 + t];
  CHECK(same, "outputs after the restore differ from the run without a stop");
  session(".ckpt3", [&](lowrankComm_t comm, void* out, cudaStream_t s) {
    if (rank == 0) lowrankBufferRestoreState(comm, out, saved.data(), saved.size());
    void* g = toDevice(gaussian(count, 7u + rank), lowrankFloat32);
    const lowrankResult_t r = lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, comm, s);
    CHECK(r == lowrankInvalidUsage && strstr(lowrankGetLastError(comm), "restored state"),
          "restore on rank 0 only gave %d: %s", int(r), lowrankGetLastError(comm));
    cudaStreamSynchronize(s);
    cudaFree(g);
  });
  printf("rank %d: checkpoint across communicators: %zu calls after the restore %s\n", rank,
         resumed.size(), same ? "bit-identical" : "DIFFER");
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
