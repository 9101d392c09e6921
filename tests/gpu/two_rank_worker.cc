// One comm rank of a multi-process device check over NCCL (two_rank_check.sh starts two, each
// with its own NCCL_HOSTID so that NCCL treats them as separate hosts even on one GPU; built
// against the CPU emulation of CUDA and the NCCL test double, the same check runs in CI).
//   two_rank_worker check RANK NRANKS IDFILE OUTFILE
//     exactness on a rank-k sum; the device engine against the host engine call after call;
//     non-finite input on one comm rank and comm ranks that disagree on the op rejected on every
//     rank without poisoning the state; agreement across ranks (OUTFILE, compared by the script);
//     mismatched counts refused on every rank; a checkpoint restored into new communicators goes
//     on bit for bit, and a restore on one rank only is refused on both; tensors with ids
//     (lowrankBufferSetTensors) at a new address every call, regrouped, and restored from a
//     format-2 checkpoint into another bucketing go on bit for bit; 16-bit factors (bfloat16,
//     float16) against the host engine, their bytes on the wire, a disagreement refused on both
//     ranks; exits non-zero on any failure.
//   two_rank_worker deadpeer RANK NRANKS IDFILE TIMEOUT_SEC [owned]
//     compressed calls queued back to back with no host synchronization until one fails; prints
//     "ready" after 5 calls (dead_peer_check.py then kills one rank), then the failure and the
//     seconds it took to surface since the last call that succeeded, then the host
//     synchronization of the calls' stream and the teardown, each with its seconds, and exits 3
//     once lowrank and NCCL are torn down (4: no call failed within 10 timeouts). owned: over
//     lowrank's own NCCL communicator (lowrankCommInitNcclRank), which lowrank aborts when the
//     call fails, so the stream synchronizes before any teardown; else the application's, which
//     the application aborts (after lowrankCommDestroy, which must not wait for it).
//   two_rank_worker memory RANK NRANKS IDFILE
//     memory pressure (a GPU only; exit 77 where the device cannot say its free memory): with all
//     but 16 MiB of the device taken, a compressible call whose state does not fit is allreduced
//     exactly (correct, counted in exactOnlyPlans, a WARN); once the memory is back and the buffer
//     reset, it is compressed again.
//   two_rank_worker bench RANK NRANKS IDFILE ELEMENTS K
//     pipelined time of a compressed allreduce vs compute alone (a one-rank communicator) and
//     communication alone (the same NCCL allreduces of the factors), and exact ncclAllReduce.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
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
void tensorIds(int rank, int nranks, const std::string& idFile);
std::vector<float> alternate(int rank, int nranks, const std::string& idFile, ncclComm_t nccl,
                             cudaStream_t s);
std::vector<float> factorDtypes(int rank, int nranks, const std::string& idFile, ncclComm_t nccl,
                                cudaStream_t s);

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
  std::vector<float> res = fromDevice(d, big, lowrankBfloat16);
  // Alternating PowerSGD's outputs go to the cross-rank comparison too.
  const std::vector<float> alt = alternate(rank, nranks, idFile, nccl, s);
  res.insert(res.end(), alt.begin(), alt.end());
  // And 16-bit factors' (issue 45).
  const std::vector<float> f16 = factorDtypes(rank, nranks, idFile, nccl, s);
  res.insert(res.end(), f16.begin(), f16.end());
  std::ofstream(outFile, std::ios::binary)
      .write(reinterpret_cast<const char*>(res.data()), res.size() * 4);
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
  tensorIds(rank, nranks, idFile);
  printf("rank %d: check %s\n", rank, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// Alternating PowerSGD (ACP-SGD) on two comm ranks: the device engine against the host engine
// (a host communicator over UCX) over 6 calls (P, Q, P, Q, P, Q) of different inputs per rank,
// per tensor and batched, pipelined in chunks of 2048 elements: every output within 1e-4 of the
// host's. Then a non-finite input on comm rank 1 at a P step and at a Q step: NaN on both ranks,
// counted, and the next calls finite. Returns every output of the device runs (compared across
// ranks by two_rank_check.sh).
std::vector<float> alternate(int rank, int nranks, const std::string& idFile, ncclComm_t nccl,
                             cudaStream_t s) {
  std::vector<float> all;
  const char* chunkWas = getenv("LOWRANK_PIPELINE_CHUNK");
  const std::string chunk = chunkWas ? chunkWas : "";
  setenv("LOWRANK_PIPELINE_CHUNK", "2048", 1);
  lowrankConfig_t cfg = config(4);
  cfg.alternate = 1;
  cfg.seed = 21;
  const lowrankUniqueId id = shareId<lowrankUniqueId>(rank, idFile + ".althost", [](lowrankUniqueId* i) {
    lowrankGetUniqueId(i);
  });
  lowrankConfig_t hostCfg = cfg;
  lowrankComm_t host = nullptr, dev = nullptr;
  if (lowrankCommInitRankConfig(&host, nranks, id, rank, &hostCfg) != lowrankSuccess ||
      lowrankCommInitFromNcclConfig(&dev, nccl, &cfg) != lowrankSuccess) {
    CHECK(false, "alternating communicators: %s", lowrankGetLastError(nullptr));
    return all;
  }
  if (rank == 0) unlink((idFile + ".althost").c_str());  // every rank has joined
  const std::vector<std::vector<size_t>> shapes = {{96, 200}, {300}, {128, 3, 3, 17}};
  size_t count = 0;
  for (const auto& sh : shapes) {
    size_t n = 1;
    for (size_t d : sh) n *= d;
    count += n;
  }
  std::vector<int> ndims;
  std::vector<const size_t*> dims;
  for (const auto& sh : shapes) {
    ndims.push_back(int(sh.size()));
    dims.push_back(sh.data());
  }
  for (int perTensor = 0; perTensor < 2; ++perTensor) {
    std::vector<float> hostOut(count);
    void* out = nullptr;
    cudaMalloc(&out, count * 4);
    if (perTensor) {
      lowrankBufferSetLayout(host, hostOut.data(), int(shapes.size()), ndims.data(), dims.data());
      lowrankBufferSetLayout(dev, out, int(shapes.size()), ndims.data(), dims.data());
    }
    for (int call = 0; call < 6; ++call) {
      const std::vector<float> x = decayingInput(1, count, rank, 40 + call);
      CHECK(lowrankAllReduce(x.data(), hostOut.data(), count, lowrankFloat32, lowrankAvg, host,
                             nullptr) == lowrankSuccess,
            "alternating host call %d: %s", call, lowrankGetLastError(host));
      void* g = toDevice(x, lowrankFloat32);
      CHECK(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, dev, s) == lowrankSuccess,
            "alternating device call %d: %s", call, lowrankGetLastError(dev));
      cudaStreamSynchronize(s);
      const std::vector<float> got = fromDevice(out, count, lowrankFloat32);
      const double e = relErr(got, hostOut);
      CHECK(e < 1e-4, "alternating %s, call %d (%s step): device vs host engine, relative "
            "difference %.3g", perTensor ? "per tensor" : "batched", call, call % 2 ? "Q" : "P", e);
      all.insert(all.end(), got.begin(), got.end());
      cudaFree(g);
    }
    lowrankBufferView_t view;
    lowrankBufferGetView(dev, out, &view);
    CHECK(view.chunks > 1, "alternating: expected several chunks, got %zu", size_t(view.chunks));
    // Rejected steps: NaN on comm rank 1 only, at the P step (call 6) and at the Q step (call 9).
    for (int call = 6; call < 10; ++call) {
      std::vector<float> x = decayingInput(1, count, rank, 40 + call);
      const bool bad = call == 6 || call == 9;
      if (bad && rank == 1) x[5] = NAN;
      void* g = toDevice(x, lowrankFloat32);
      CHECK(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, dev, s) == lowrankSuccess,
            "alternating device call %d: %s", call, lowrankGetLastError(dev));
      cudaStreamSynchronize(s);
      const std::vector<float> got = fromDevice(out, count, lowrankFloat32);
      const size_t nan = size_t(std::count_if(got.begin(), got.end(), [](float v) { return std::isnan(v); }));
      if (bad) CHECK(nan > 0 && std::isnan(got[5]), "alternating call %d: rejected, yet %zu NaN", call, nan);
      else CHECK(nan == 0, "alternating call %d after a rejected one: %zu NaN", call, nan);
      all.insert(all.end(), got.begin(), got.end());
      cudaFree(g);
    }
    lowrankBufferRelease(dev, out);
    cudaFree(out);
  }
  lowrankStats_t st;
  lowrankGetStats(dev, &st);
  CHECK(st.fallbackCalls == 4, "alternating: fallbackCalls %llu, want the 4 rejected calls",
        (unsigned long long)st.fallbackCalls);
  lowrankCommDestroy(dev);
  lowrankCommDestroy(host);
  if (chunkWas) setenv("LOWRANK_PIPELINE_CHUNK", chunk.c_str(), 1);
  else unsetenv("LOWRANK_PIPELINE_CHUNK");
  printf("rank %d: alternating PowerSGD: 2 x 10 calls checked\n", rank);
  return all;
}

// 16-bit factors (issue 45) on two comm ranks, per tensor in chunks of 2048 elements, for
// factorDtype float32, bfloat16 and float16, PowerSGD's schedule and the alternating one (one
// buffer each, lowrankBufferSetAlternate): the device engine against the host engine (a host
// communicator over UCX with the same factorDtype) over 3 calls. bfloat16: both round each
// rank's factor once; NCCL's ring then rounds the sum to bfloat16 where the host's algorithms at
// N = 2 (direct, recursive doubling) keep it in float32 (docs/design.md, "16-bit factors"), so they
// differ by one bfloat16 rounding of each reduced factor (2^-9 each) per call, carried by warm start:
// within 2^-6 over 3 calls (emulation: 3.2e-3, 6.6e-3, 8.8e-3). float16: the host rounds to
// float16, the device to bfloat16 (docs/design.md, "On a device"): within 2^-6 alike (emulation:
// 7.7e-3). float32: 1e-4, as the other device checks. And every call's
// bytesSent (lowrankStats_t) equal to NCCL's ring model at N = 2 (each rank sends each element
// once): 4 bytes per exact element and per check word, 2 per 16-bit factor element, 4 per float32
// one; PowerSGD: 4 E + w (P + Q) + 8, alternating: 4 E + w P + 8 (P step), 4 E + w Q + 8 (Q step),
// w the factor element's bytes. Then comm ranks that disagree on the factor dtype (bfloat16 on
// rank 0, float32 on rank 1) both fail the call with lowrankInvalidUsage. Returns the device
// outputs (compared across ranks by two_rank_check.sh).
std::vector<float> factorDtypes(int rank, int nranks, const std::string& idFile, ncclComm_t nccl,
                                cudaStream_t s) {
  std::vector<float> all;
  double worst[3] = {0, 0, 0};  // per factor dtype: the largest device vs host difference
  const char* chunkWas = getenv("LOWRANK_PIPELINE_CHUNK");
  const std::string chunk = chunkWas ? chunkWas : "";
  setenv("LOWRANK_PIPELINE_CHUNK", "2048", 1);
  const std::vector<std::vector<size_t>> shapes = {{96, 200}, {300}, {128, 3, 3, 17}};
  size_t count = 0;
  std::vector<int> ndims;
  std::vector<const size_t*> dims;
  for (const auto& sh : shapes) {
    size_t n = 1;
    for (size_t d : sh) n *= d;
    count += n;
    ndims.push_back(int(sh.size()));
    dims.push_back(sh.data());
  }
  for (const int fd : {int(lowrankFloat32), int(lowrankBfloat16), int(lowrankFloat16)}) {
    lowrankConfig_t cfg = config(4);
    cfg.factorDtype = fd;
    cfg.seed = 23;
    const std::string tag = idFile + ".fd" + std::to_string(fd);
    const lowrankUniqueId id = shareId<lowrankUniqueId>(rank, tag, [](lowrankUniqueId* i) {
      lowrankGetUniqueId(i);
    });
    lowrankConfig_t hostCfg = cfg;
    lowrankComm_t host = nullptr, dev = nullptr;
    if (lowrankCommInitRankConfig(&host, nranks, id, rank, &hostCfg) != lowrankSuccess ||
        lowrankCommInitFromNcclConfig(&dev, nccl, &cfg) != lowrankSuccess) {
      CHECK(false, "factor dtype %d: communicators: %s", fd, lowrankGetLastError(nullptr));
      return all;
    }
    if (rank == 0) unlink(tag.c_str());  // every rank has joined
    const double tol = fd == lowrankFloat32 ? 1e-4 : 0x1p-6;
    const uint64_t w = fd == lowrankFloat32 ? 4 : 2;
    for (int alt = 0; alt < 2; ++alt) {
      std::vector<float> hostOut(count);
      void* out = nullptr;
      cudaMalloc(&out, count * 4);
      for (lowrankComm_t c : {host, dev}) {
        void* b = c == host ? static_cast<void*>(hostOut.data()) : out;
        lowrankBufferSetLayout(c, b, int(shapes.size()), ndims.data(), dims.data());
        lowrankBufferSetAlternate(c, b, alt);
      }
      for (int call = 0; call < 3; ++call) {
        const std::vector<float> x = decayingInput(1, count, rank, 60 + call);
        CHECK(lowrankAllReduce(x.data(), hostOut.data(), count, lowrankFloat32, lowrankAvg, host,
                               nullptr) == lowrankSuccess,
              "factor dtype %d: host call %d: %s", fd, call, lowrankGetLastError(host));
        void* g = toDevice(x, lowrankFloat32);
        lowrankStats_t before, after;
        lowrankGetStats(dev, &before);
        CHECK(lowrankAllReduce(g, out, count, lowrankFloat32, lowrankAvg, dev, s) == lowrankSuccess,
              "factor dtype %d: device call %d: %s", fd, call, lowrankGetLastError(dev));
        cudaStreamSynchronize(s);
        lowrankGetStats(dev, &after);
        const std::vector<float> got = fromDevice(out, count, lowrankFloat32);
        const double e = relErr(got, hostOut);
        double& wd = worst[fd == lowrankFloat32 ? 0 : fd == lowrankBfloat16 ? 1 : 2];
        wd = std::max(wd, e);
        CHECK(e < tol, "factor dtype %d, %s, call %d: device vs host engine, relative difference "
              "%.3g (bound %.3g)", fd, alt ? "alternating" : "PowerSGD", call, e, tol);
        all.insert(all.end(), got.begin(), got.end());
        cudaFree(g);
        lowrankBufferView_t view;
        lowrankBufferGetView(dev, out, &view);
        const uint64_t E = view.exactElements, P = view.pElements, Q = view.qElements;
        // the first call also makes the plan check: LOWRANK_PLAN_CHECK_WORDS uint64 words
        const uint64_t plan = call == 0 ? 5 * 8 : 0;
        const uint64_t want = plan + 4 * E + 8 +
                              (!alt ? w * (P + Q) : call % 2 == 0 ? w * P : w * Q);
        if (nranks == 2)
          CHECK(after.bytesSent - before.bytesSent == want,
                "factor dtype %d, %s, call %d: bytesSent grew by %llu, the model says %llu", fd,
                alt ? "alternating" : "PowerSGD", call,
                (unsigned long long)(after.bytesSent - before.bytesSent), (unsigned long long)want);
      }
      lowrankBufferRelease(dev, out);
      lowrankBufferRelease(host, hostOut.data());
      cudaFree(out);
    }
    lowrankCommDestroy(dev);
    lowrankCommDestroy(host);
  }
  // Comm ranks that disagree on the factor dtype fail together (the plan check).
  {
    lowrankConfig_t cfg = config(4);
    cfg.factorDtype = rank == 0 ? lowrankBfloat16 : lowrankFloat32;
    lowrankComm_t dev = nullptr;
    if (lowrankCommInitFromNcclConfig(&dev, nccl, &cfg) != lowrankSuccess) {
      CHECK(false, "factor dtype disagreement: communicator: %s", lowrankGetLastError(nullptr));
    } else {
      const std::vector<float> x = decayingInput(1, count, rank, 70);
      void* g = toDevice(x, lowrankFloat32);
      lowrankBufferSetLayout(dev, g, int(shapes.size()), ndims.data(), dims.data());
      const lowrankResult_t r = lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, dev, s);
      CHECK(r == lowrankInvalidUsage, "ranks disagreeing on the factor dtype: result %d (%s), want "
            "lowrankInvalidUsage", int(r), lowrankGetLastError(dev));
      cudaStreamSynchronize(s);
      cudaFree(g);
      lowrankCommDestroy(dev);
    }
  }
  if (chunkWas) setenv("LOWRANK_PIPELINE_CHUNK", chunk.c_str(), 1);
  else unsetenv("LOWRANK_PIPELINE_CHUNK");
  printf("rank %d: 16-bit factors: 3 dtypes x 2 schedules x 3 calls checked; device vs host at "
         "most %.2g (fp32), %.2g (bf16), %.2g (fp16)\n", rank, worst[0], worst[1], worst[2]);
  return all;
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

// Tensor ids across two comm ranks (tests/gpu/test_cuda_tensor_ids.cc has them at one on the
// emulation): tensors a, b, c (ids 101, 202, 303) in one stable buffer for 6 calls, against
// 3 calls of [a, b, c] at a new address every call (two streams, no synchronize between calls),
// then [c, a] and [b]; and against a format-2 checkpoint of those 3 calls restored on new
// communicators into [b, c] and [a]: every tensor's outputs the same bits (a sum of two is exact
// in any order), and each id's state after the last call the same; with a fresh state at call 3
// they differ.
void tensorIds(int rank, int nranks, const std::string& idFile) {
  struct T {
    uint64_t id;
    std::vector<size_t> shape;
    size_t numel() const { return shape.size() == 1 ? shape[0] : shape[0] * shape[1]; }
  };
  using Group = std::vector<T>;
  using Outs = std::map<uint64_t, std::vector<float>>;
  const T a{101, {48, 40}}, b{202, {32, 30}}, c{303, {16}};
  const Group abc = {a, b, c}, ca = {c, a}, bOnly = {b}, bc = {b, c}, aOnly = {a};
  const int first = 3, calls = 6;
  auto countOf = [](const Group& g) {
    size_t n = 0;
    for (const T& t : g) n += t.numel();
    return n;
  };
  std::vector<void*> blocks;  // this session's device memory, freed after a synchronize
  auto input = [&](const Group& g, int call) {
    std::vector<float> x;
    for (const T& t : g) {
      const std::vector<float> v = gaussian(t.numel(), unsigned(t.id * 7919 + 1000 * call + rank));
      x.insert(x.end(), v.begin(), v.end());
    }
    blocks.push_back(toDevice(x, lowrankFloat32));
    return blocks.back();
  };
  auto alloc = [&](size_t n) {
    void* p = nullptr;
    cudaMalloc(&p, n * 4);
    blocks.push_back(p);
    return p;
  };
  // One call of group g on buffer out (declared first), its output copied on s into new memory.
  auto call = [&](lowrankComm_t comm, const Group& g, int t, void* out, cudaStream_t s) {
    std::vector<lowrankTensor_t> d;
    for (const T& x : g) {
      lowrankTensor_t y{};
      y.id = x.id;
      y.ndims = int(x.shape.size());
      for (size_t i = 0; i < x.shape.size(); ++i) y.shape[i] = x.shape[i];
      y.approxRank = LOWRANK_RANK_DEFAULT;
      d.push_back(y);
    }
    CHECK(lowrankBufferSetTensors(comm, out, int(d.size()), d.data()) == lowrankSuccess,
          "ids: declare: %s", lowrankGetLastError(comm));
    const size_t n = countOf(g);
    CHECK(lowrankAllReduce(input(g, t), out, n, lowrankFloat32, lowrankAvg, comm, s) == lowrankSuccess,
          "ids: call %d: %s", t, lowrankGetLastError(comm));
    void* snap = alloc(n);
    cudaMemcpyAsync(snap, out, n * 4, cudaMemcpyDeviceToDevice, s);
    return snap;
  };
  // Reads the copies of `calls` (group, copy) into outs[t] by id, after a synchronize.
  using Copies = std::vector<std::vector<std::pair<const Group*, void*>>>;
  auto read = [&](const Copies& copies, std::vector<Outs>* outs) {
    cudaDeviceSynchronize();
    outs->assign(size_t(calls), Outs());
    for (size_t t = 0; t < copies.size(); ++t)
      for (const auto& [g, d] : copies[t]) {
        const std::vector<float> flat = fromDevice(d, countOf(*g), lowrankFloat32);
        size_t off = 0;
        for (const T& x : *g) {
          (*outs)[t][x.id].assign(flat.begin() + long(off), flat.begin() + long(off + x.numel()));
          off += x.numel();
        }
      }
  };
  auto save = [&](lowrankComm_t comm, const void* buf) {
    size_t size = 0;
    lowrankBufferSaveState(comm, buf, nullptr, &size);
    std::vector<unsigned char> bytes(size);
    CHECK(lowrankBufferSaveState(comm, buf, bytes.data(), &size) == lowrankSuccess, "ids: save: %s",
          lowrankGetLastError(comm));
    return bytes;
  };
  auto byId = [&](const std::vector<unsigned char>& bytes) {
    lowrank::SavedTensors st;
    CHECK(lowrank::decode(bytes.data(), bytes.size(), &st).ok(), "ids: not format-2 bytes");
    std::map<uint64_t, lowrank::SavedTensor> m;
    for (auto& x : st.tensors) m[x.id] = x;
    return m;
  };
  // One session: fresh NCCL and lowrank communicators, two non-blocking streams.
  auto session = [&](const char* tag, auto body) {
    ncclComm_t nccl = joinNccl(rank, nranks, idFile + tag);
    lowrankConfig_t cfg = config(3);
    cfg.seed = 5;
    cfg.startIter = 0;
    lowrankComm_t comm = nullptr;
    CHECK(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg) == lowrankSuccess, "ids: comm: %s",
          lowrankGetLastError(nullptr));
    cudaStream_t s[2];
    for (auto& x : s) cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
    body(comm, s);
    cudaDeviceSynchronize();
    for (auto& x : s) cudaStreamDestroy(x);
    lowrankCommDestroy(comm);  // releases every buffer
    for (void* p : blocks) cudaFree(p);
    blocks.clear();
    ncclCommDestroy(nccl);
    if (rank == 0) unlink((idFile + tag).c_str());
  };
  auto sameBits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  auto compare = [&](const std::vector<Outs>& got, const std::vector<Outs>& want, int from,
                     const char* what) {
    bool all = true;
    for (int t = from; t < calls; ++t)
      for (const T& x : abc) {
        const Outs& o = got[size_t(t)];
        const bool ok = o.count(x.id) && sameBits(o.at(x.id), want[size_t(t)].at(x.id));
        CHECK(ok, "ids, %s: call %d, tensor id %llu differs from the straight run", what, t,
              (unsigned long long)x.id);
        all = all && ok;
      }
    return all;
  };

  std::vector<Outs> straight, moved, resumed, fresh;
  std::vector<unsigned char> straightState, saved;
  session(".ids0", [&](lowrankComm_t comm, cudaStream_t* s) {
    void* out = alloc(countOf(abc));
    Copies copies(static_cast<size_t>(calls));
    for (int t = 0; t < calls; ++t) copies[size_t(t)].push_back({&abc, call(comm, abc, t, out, s[0])});
    read(copies, &straight);
    straightState = save(comm, out);
  });
  session(".ids1", [&](lowrankComm_t comm, cudaStream_t* s) {
    Copies copies(static_cast<size_t>(calls));
    void* last = nullptr;
    for (int t = 0; t < first; ++t) {
      last = alloc(countOf(abc));  // a new address every call
      copies[size_t(t)].push_back({&abc, call(comm, abc, t, last, s[t % 2])});
    }
    saved = save(comm, last);
    void* bufCa = alloc(countOf(ca));
    void* bufB = alloc(countOf(bOnly));
    for (int t = first; t < calls; ++t) {
      copies[size_t(t)].push_back({&ca, call(comm, ca, t, bufCa, s[0])});
      copies[size_t(t)].push_back({&bOnly, call(comm, bOnly, t, bufB, s[1])});
    }
    read(copies, &moved);
  });
  std::map<uint64_t, lowrank::SavedTensor> resumedState;
  session(".ids2", [&](lowrankComm_t comm, cudaStream_t* s) {
    void* elsewhere = alloc(16);
    CHECK(lowrankBufferRestoreState(comm, elsewhere, saved.data(), saved.size()) == lowrankSuccess,
          "ids: restore: %s", lowrankGetLastError(comm));
    void* bufBc = alloc(countOf(bc));
    void* bufA = alloc(countOf(aOnly));
    Copies copies(static_cast<size_t>(calls));
    for (int t = first; t < calls; ++t) {
      copies[size_t(t)].push_back({&bc, call(comm, bc, t, bufBc, s[0])});
      copies[size_t(t)].push_back({&aOnly, call(comm, aOnly, t, bufA, s[1])});
    }
    read(copies, &resumed);
    resumedState = byId(save(comm, bufBc));
    for (auto& kv : byId(save(comm, bufA))) resumedState[kv.first] = kv.second;
  });
  session(".ids3", [&](lowrankComm_t comm, cudaStream_t* s) {
    void* bufBc = alloc(countOf(bc));
    void* bufA = alloc(countOf(aOnly));
    Copies copies(static_cast<size_t>(calls));
    copies[size_t(first)].push_back({&bc, call(comm, bc, first, bufBc, s[0])});
    copies[size_t(first)].push_back({&aOnly, call(comm, aOnly, first, bufA, s[1])});
    read(copies, &fresh);
  });
  const bool movedSame = compare(moved, straight, 0, "new address every call, then regrouped");
  const bool resumedSame = compare(resumed, straight, first, "format-2 checkpoint into [b, c] and [a]");
  bool stateSame = resumedState.size() == abc.size();
  for (const auto& kv : byId(straightState)) {
    const auto it = resumedState.find(kv.first);
    const bool ok = it != resumedState.end() && it->second.calls == kv.second.calls &&
                    it->second.haveQ == kv.second.haveQ && it->second.residual == kv.second.residual &&
                    it->second.qt == kv.second.qt;
    CHECK(ok, "ids: tensor id %llu: state after the restored run differs from the straight run's",
          (unsigned long long)kv.first);
    stateSame = stateSame && ok;
  }
  for (const T* x : {&a, &b})
    CHECK(fresh[size_t(first)].count(x->id) &&
              !sameBits(fresh[size_t(first)].at(x->id), straight[size_t(first)].at(x->id)),
          "ids: tensor id %llu: a fresh state at call %d gives the carried state's output",
          (unsigned long long)x->id, first);
  printf("rank %d: tensor ids: moved and regrouped %s, format-2 checkpoint into another bucketing "
         "%s (state per id %s)\n", rank, movedSame ? "bit-identical" : "DIFFER",
         resumedSame ? "bit-identical" : "DIFFER", stateSame ? "the same" : "DIFFERS");
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

// A peer killed mid-call (issue 26, item 2): every survivor's call fails within the timeout
// (plus the script's 5 s), and teardown does not hang on the collective that never ends.
int deadPeer(int rank, int nranks, const std::string& idFile, double timeoutSec, bool owned) {
  lowrankConfig_t cfg = config(4);
  cfg.timeoutSec = timeoutSec;
  cfg.startIter = 0;
  ncclComm_t nccl = nullptr;
  lowrankComm_t comm = nullptr;
  if (owned) {
    const ncclUniqueId id = shareId<ncclUniqueId>(rank, idFile, [](ncclUniqueId* i) {
      lowrankNcclGetUniqueId(i);
    });
    if (lowrankCommInitNcclRank(&comm, nranks, id, rank, &cfg) != lowrankSuccess) return 2;
  } else {
    nccl = joinNccl(rank, nranks, idFile);
    if (lowrankCommInitFromNcclConfig(&comm, nccl, &cfg) != lowrankSuccess) return 2;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const size_t n = 96, m = 128;
  void* g = toDevice(decayingInput(n, m, rank), lowrankFloat32);
  using Clock = std::chrono::steady_clock;
  auto secondsSince = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto last = Clock::now();
  const auto start = last;
  for (int call = 0;; ++call) {
    const lowrankResult_t r = lowrankAllReduce(g, g, n * m, lowrankFloat32, lowrankAvg, comm, s);
    const auto now = Clock::now();
    if (r != lowrankSuccess) {
      printf("rank %d: call %d failed %.2f s after the last call that succeeded: %s\n", rank, call,
             std::chrono::duration<double>(now - last).count(), lowrankGetLastError(comm));
      fflush(stdout);
      break;
    }
    last = now;
    if (call == 5) {
      printf("rank %d: ready\n", rank);
      fflush(stdout);
    }
    if (now - start > std::chrono::duration<double>(10 * timeoutSec + 60)) {
      printf("rank %d: no call failed\n", rank);
      return 4;
    }
  }
  auto synchronize = [&] {  // the caller's next host synchronization (PyTorch's .item())
    const auto t = Clock::now();
    const cudaError_t e = cudaStreamSynchronize(s);
    printf("rank %d: stream synchronized (%s) %.2f s after the failure was seen\n", rank,
           cudaGetErrorName(e), secondsSince(t));
    fflush(stdout);
  };
  auto t = Clock::now();
  if (owned) {  // lowrank aborted its NCCL comm when the call failed: nothing is left spinning
    synchronize();
    t = Clock::now();
    lowrankCommDestroy(comm);
  } else {  // bounded: a communicator that failed waits no more; then the application's abort
    lowrankCommDestroy(comm);
    ncclCommAbort(nccl);
    synchronize();
  }
  printf("rank %d: torn down (lowrankCommDestroy took %.2f s)\n", rank, secondsSince(t));
  fflush(stdout);
  _exit(3);  // the emulated device's queues may still hold the never-ending collective
}

int memoryPressure(int rank, int nranks, const std::string& idFile) {
  size_t freeBytes = 0, total = 0;
  if (cudaMemGetInfo(&freeBytes, &total) != cudaSuccess) {
    printf("rank %d: memory check skipped: cudaMemGetInfo is not available here\n", rank);
    return 77;
  }
  ncclComm_t nccl = joinNccl(rank, nranks, idFile);
  lowrankConfig_t cfg = config(4);
  cfg.startIter = 0;
  lowrankComm_t comm = nullptr;
  if (lowrankCommInitFromNcclConfig(&comm, nccl, &cfg) != lowrankSuccess) return 2;
  const size_t n = 4096, m = 4096, count = n * m;  // a 64 MiB residual: more than is left
  std::vector<float> want(count, 0.f);
  for (int r = 0; r < nranks; ++r) {
    const std::vector<float> x = decayingInput(n, m, r);
    for (size_t i = 0; i < count; ++i) want[i] += x[i] / float(nranks);
  }
  void* g = toDevice(decayingInput(n, m, rank), lowrankFloat32);
  void* hog = nullptr;
  cudaMemGetInfo(&freeBytes, &total);
  for (size_t take = freeBytes - (16u << 20); take > (64u << 20); take -= 16u << 20)
    if (cudaMalloc(&hog, take) == cudaSuccess) break;
  (void)cudaGetLastError();
  CHECK(hog != nullptr, "could not take the device's memory");
  lowrankResult_t r = lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, comm, nullptr);
  CHECK(r == lowrankSuccess, "call under memory pressure: %s", lowrankGetLastError(comm));
  cudaDeviceSynchronize();
  lowrankStats_t st;
  lowrankGetStats(comm, &st);
  CHECK(st.exactOnlyPlans == 1, "exactOnlyPlans %llu, want 1", (unsigned long long)st.exactOnlyPlans);
  CHECK(st.compressedCalls == 0, "compressedCalls %llu under pressure", (unsigned long long)st.compressedCalls);
  const double e = relErr(fromDevice(g, count, lowrankFloat32), want);
  CHECK(e < 1e-5, "the exact fallback's relative error %.3g", e);
  cudaFree(hog);
  lowrankBufferReset(comm, g);
  r = lowrankAllReduce(g, g, count, lowrankFloat32, lowrankAvg, comm, nullptr);
  CHECK(r == lowrankSuccess, "call after the memory came back: %s", lowrankGetLastError(comm));
  cudaDeviceSynchronize();
  lowrankGetStats(comm, &st);
  CHECK(st.compressedCalls == 1, "compressedCalls %llu after the memory came back, want 1",
        (unsigned long long)st.compressedCalls);
  printf("rank %d: memory pressure: exact-only plans %llu, then compressed %llu; %s\n", rank,
         (unsigned long long)st.exactOnlyPlans, (unsigned long long)st.compressedCalls,
         failures ? "FAILED" : "ok");
  lowrankCommDestroy(comm);
  ncclCommDestroy(nccl);
  cudaFree(g);
  return failures ? 1 : 0;
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
  if (mode == "memory" && argc == 5) return memoryPressure(rank, nranks, argv[4]);
  if (mode == "deadpeer" && (argc == 6 || (argc == 7 && std::string(argv[6]) == "owned")))
    return deadPeer(rank, nranks, argv[4], atof(argv[5]), argc == 7);
  if (mode == "bench" && argc == 7) return bench(rank, nranks, argv[4], strtoull(argv[5], nullptr, 10), atoi(argv[6]));
  fprintf(stderr, "bad arguments\n");
  return 2;
}
