// The worker of the multi-process tests (driven by mp_test.py). Public C API only.
//
//   mp_worker run PREFIX          lowrankCommInitFromEnv, the scenario below, outputs to PREFIX.<rank>
//   mp_worker threads N PREFIX    the same scenario with N comm ranks as threads of this process
//                                 (lowrankGetUniqueId + lowrankCommInitRank): the reference
//   mp_worker init                lowrankCommInitFromEnv only; prints "RESULT <code>: <message>"
//   mp_worker loop ITERS          allreduces in a loop; prints READY after the first; on an error
//                                 prints "ERROR <code> t=<CLOCK_MONOTONIC s>: <message>", destroys
//                                 the comm and exits 3
//   mp_worker mismatch            the last comm rank passes another count: expects
//                                 lowrankInvalidUsage; prints "RESULT <code>: ..."
//   mp_worker fewer CALLS         the last comm rank makes CALLS-1 calls then idles; the others
//                                 expect lowrankTimeout or lowrankRemoteError on their last call
//
// Exit codes: 0 success (or the expected error), 1 an unexpected result, 2 usage, 3 error in loop.
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lowrank/lowrank.h"

namespace {

double monoNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return uint16_t(u >> 16);
}

float input(int rank, int call, int buf, size_t i) {
  // Smooth, rank- and call-dependent, with a low-rank part so that compression has work to do.
  double x = double(i);
  return float(std::sin(0.013 * x + 0.9 * rank + 0.31 * call + buf) +
               0.5 * std::cos(0.0007 * x * (buf + 1)) * (1 + rank) +
               0.05 * double((i * 7919 + size_t(rank) * 31 + size_t(call) * 17) % 101) / 101.0);
}

struct Tensor {
  std::vector<size_t> shape;
};

struct BufSpec {
  lowrankDataType_t dtype;
  lowrankRedOp_t op;
  size_t count;
  bool inPlace;
  std::vector<Tensor> layout;  // empty: batched
};

std::vector<BufSpec> scenario() {
  return {
      {lowrankFloat32, lowrankSum, 3000, false, {}},                                  // batched, direct
      {lowrankBfloat16, lowrankAvg, 2500, true, {}},                                  // batched, in place
      {lowrankFloat32, lowrankAvg, 48 * 40 + 40 + 8 * 6 * 5, false,
       {{{48, 40}}, {{40}}, {{8, 6, 5}}}},                                            // per tensor
      {lowrankBfloat16, lowrankSum, 32 * 64 + 64, false, {{{32, 64}}, {{64}}}},       // per tensor
      {lowrankFloat32, lowrankAvg, 20000, false, {}},                                 // batched, ring
  };
}
constexpr int kSteps = 3;

struct Buffers {
  std::vector<uint8_t> send, recv;
};

// Runs the scenario on one comm rank, appending every output (raw bytes) to *out.
lowrankResult_t runScenario(lowrankComm_t comm, int rank, std::string* out, std::string* err) {
  auto specs = scenario();
  std::vector<Buffers> bufs(specs.size());
  for (size_t b = 0; b < specs.size(); ++b) {
    const BufSpec& s = specs[b];
    size_t esz = s.dtype == lowrankFloat32 ? 4 : 2;
    bufs[b].send.resize(s.count * esz);
    bufs[b].recv.resize(s.count * esz);
    if (!s.layout.empty()) {
      std::vector<int> ndims;
      std::vector<const size_t*> shapes;
      for (const Tensor& t : s.layout) {
        ndims.push_back(int(t.shape.size()));
        shapes.push_back(t.shape.data());
      }
      lowrankResult_t r = lowrankBufferSetLayout(comm, bufs[b].recv.data(), int(ndims.size()),
                                                 ndims.data(), shapes.data());
      if (r != lowrankSuccess) {
        *err = std::string("lowrankBufferSetLayout: ") + lowrankGetLastError(comm);
        return r;
      }
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    for (size_t b = 0; b < specs.size(); ++b) {
      const BufSpec& s = specs[b];
      Buffers& B = bufs[b];
      std::vector<uint8_t>& in = s.inPlace ? B.recv : B.send;
      for (size_t i = 0; i < s.count; ++i) {
        float v = input(rank, step, int(b), i);
        if (s.dtype == lowrankFloat32) std::memcpy(in.data() + 4 * i, &v, 4);
        else {
          uint16_t h = toBf16(v);
          std::memcpy(in.data() + 2 * i, &h, 2);
        }
      }
      lowrankResult_t r = lowrankAllReduce(in.data(), B.recv.data(), s.count, s.dtype, s.op, comm, nullptr);
      if (r != lowrankSuccess) {
        *err = "lowrankAllReduce (step " + std::to_string(step) + ", buffer " + std::to_string(b) +
               "): " + lowrankGetLastError(comm);
        return r;
      }
      out->append(reinterpret_cast<const char*>(B.recv.data()), B.recv.size());
    }
  }
  lowrankStats_t st;
  if (lowrankGetStats(comm, &st) != lowrankSuccess || st.compressedCalls == 0) {
    *err = "no call was compressed (compressedCalls = 0): the test would prove nothing";
    return lowrankInternalError;
  }
  return lowrankSuccess;
}

bool writeFile(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  return std::fclose(f) == 0 && ok;
}

int initFromEnv(lowrankComm_t* comm, int* rank, int* nranks) {
  lowrankResult_t r = lowrankCommInitFromEnv(comm);
  if (r != lowrankSuccess) {
    std::printf("RESULT %d: %s\n", int(r), lowrankGetLastError(nullptr));
    std::fflush(stdout);
    return int(r);
  }
  lowrankCommUserRank(*comm, rank);
  lowrankCommCount(*comm, nranks);
  return 0;
}

int modeRun(const std::string& prefix) {
  lowrankComm_t comm;
  int rank = -1, n = 0;
  if (int r = initFromEnv(&comm, &rank, &n)) return 10 + r;
  std::string out, err;
  lowrankResult_t r = runScenario(comm, rank, &out, &err);
  if (r != lowrankSuccess) {
    std::fprintf(stderr, "comm rank %d: %s: %s\n", rank, lowrankGetErrorString(r), err.c_str());
    lowrankCommDestroy(comm);
    return 1;
  }
  lowrankCommDestroy(comm);
  if (!writeFile(prefix + "." + std::to_string(rank), out)) {
    std::perror("write");
    return 1;
  }
  std::printf("OK comm rank %d of %d, %zu bytes\n", rank, n, out.size());
  return 0;
}

int modeThreads(int n, const std::string& prefix) {
  lowrankUniqueId id;
  if (lowrankGetUniqueId(&id) != lowrankSuccess) {
    std::fprintf(stderr, "lowrankGetUniqueId: %s\n", lowrankGetLastError(nullptr));
    return 1;
  }
  std::vector<int> rc(size_t(n), 0);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      lowrankComm_t comm;
      if (lowrankCommInitRank(&comm, n, id, r) != lowrankSuccess) {
        std::fprintf(stderr, "comm rank %d: init: %s\n", r, lowrankGetLastError(nullptr));
        rc[size_t(r)] = 1;
        return;
      }
      std::string out, err;
      lowrankResult_t res = runScenario(comm, r, &out, &err);
      lowrankCommDestroy(comm);
      if (res != lowrankSuccess) {
        std::fprintf(stderr, "comm rank %d: %s\n", r, err.c_str());
        rc[size_t(r)] = 1;
      } else if (!writeFile(prefix + "." + std::to_string(r), out)) {
        rc[size_t(r)] = 1;
      }
    });
  for (auto& t : th) t.join();
  for (int x : rc)
    if (x) return 1;
  return 0;
}

int modeLoop(long iters) {
  lowrankComm_t comm;
  int rank = -1, n = 0;
  if (int r = initFromEnv(&comm, &rank, &n)) return 10 + r;
  const size_t count = 4096;
  std::vector<float> send(count), recv(count);
  for (long it = 0; it < iters; ++it) {
    for (size_t i = 0; i < count; ++i) send[i] = input(rank, int(it % 7), 0, i);
    lowrankResult_t r = lowrankAllReduce(send.data(), recv.data(), count, lowrankFloat32, lowrankSum,
                                         comm, nullptr);
    if (r != lowrankSuccess) {
      std::printf("ERROR %d t=%.3f iter=%ld: %s\n", int(r), monoNow(), it, lowrankGetLastError(comm));
      std::fflush(stdout);
      lowrankCommDestroy(comm);
      std::printf("DESTROYED t=%.3f\n", monoNow());
      std::fflush(stdout);
      return 3;
    }
    if (it == 0) {
      std::printf("READY comm rank %d\n", rank);
      std::fflush(stdout);
    }
  }
  lowrankCommDestroy(comm);
  std::printf("FINISHED %ld iterations\n", iters);
  return 0;
}

int modeMismatch() {
  lowrankComm_t comm;
  int rank = -1, n = 0;
  if (int r = initFromEnv(&comm, &rank, &n)) return 10 + r;
  size_t count = 2000 + (rank == n - 1 ? 16 : 0);
  std::vector<float> send(count), recv(count);
  for (size_t i = 0; i < count; ++i) send[i] = input(rank, 0, 0, i);
  lowrankResult_t r = lowrankAllReduce(send.data(), recv.data(), count, lowrankFloat32, lowrankSum,
                                       comm, nullptr);
  std::printf("RESULT %d: %s\n", int(r), r ? lowrankGetLastError(comm) : "");
  std::fflush(stdout);
  lowrankCommDestroy(comm);
  return r == lowrankInvalidUsage ? 0 : 1;
}

int modeFewer(int calls) {
  lowrankComm_t comm;
  int rank = -1, n = 0;
  if (int r = initFromEnv(&comm, &rank, &n)) return 10 + r;
  const bool shortRank = rank == n - 1;
  const size_t count = 3000;
  std::vector<float> send(count), recv(count);
  lowrankResult_t r = lowrankSuccess;
  int c = 0;
  for (; c < calls - (shortRank ? 1 : 0) && r == lowrankSuccess; ++c) {
    for (size_t i = 0; i < count; ++i) send[i] = input(rank, c, 0, i);
    r = lowrankAllReduce(send.data(), recv.data(), count, lowrankFloat32, lowrankSum, comm, nullptr);
  }
  if (shortRank) {
    // Keep the comm alive (so that the others wait, not see a disconnection) until they timed out.
    const char* t = std::getenv("LOWRANK_TIMEOUT");
    double idle = (t ? std::atof(t) : 3.0) + 2.0;
    std::printf("SHORT comm rank %d made %d calls (%s), idles %.1f s\n", rank, c,
                lowrankGetErrorString(r), idle);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(idle));
    lowrankCommDestroy(comm);
    return r == lowrankSuccess ? 0 : 1;
  }
  std::printf("RESULT %d t=%.3f calls=%d: %s\n", int(r), monoNow(), c,
              r ? lowrankGetLastError(comm) : "");
  std::fflush(stdout);
  lowrankCommDestroy(comm);
  return (r == lowrankTimeout || r == lowrankRemoteError) && c == calls ? 0 : 1;
}

int usage() {
  std::fprintf(stderr, "usage: mp_worker run PREFIX | threads N PREFIX | init | loop ITERS | "
                       "mismatch | fewer CALLS\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) return usage();
  std::string mode = argv[1];
  if (mode == "run" && argc == 3) return modeRun(argv[2]);
  if (mode == "threads" && argc == 4) return modeThreads(std::atoi(argv[2]), argv[3]);
  if (mode == "init" && argc == 2) {
    lowrankComm_t comm;
    int rank, n;
    int r = initFromEnv(&comm, &rank, &n);
    if (r == 0) {
      std::printf("RESULT 0: comm rank %d of %d\n", rank, n);
      lowrankCommDestroy(comm);
    }
    return 0;
  }
  if (mode == "loop" && argc == 3) return modeLoop(std::atol(argv[2]));
  if (mode == "mismatch" && argc == 2) return modeMismatch();
  if (mode == "fewer" && argc == 3) return modeFewer(std::atoi(argv[2]));
  return usage();
}
