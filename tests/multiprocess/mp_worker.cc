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
//   mp_worker ckpt FIRST CALLS [OPTION]...
//                                 checkpoints (lowrankBufferSaveState / RestoreState) of two buffers,
//                                 a per-tensor one (2-D, 1-D bias, 2-D) and a batched bfloat16 one:
//                                 calls FIRST .. FIRST+CALLS-1, inputs from (rank, call). Options:
//     out=PREFIX       every call's outputs (buffer 0 then 1) appended to PREFIX.<rank>
//     save=PATH        after the calls, each buffer's state saved to PATH (templated, below)
//     restore=PATH     before the calls (after the layout), each buffer's state restored from PATH;
//                      a refused restore fails the run
//     try=PATH         (repeatable) a restore attempt of each buffer from PATH that may be refused:
//                      prints "TRY b<buf> <code>: <message>" and goes on
//     before-layout    restore before lowrankBufferSetLayout instead of after it
//     pre=K            K calls (inputs of other calls, outputs dropped) before the restore: a
//                      restore into a buffer that is already planned
//     ranks=R,R..      only these comm ranks restore (default: every one)
//     retry            a failed call prints "CALLERR c<call> b<buf> <code>: <message>"; a comm rank
//                      that restored then calls lowrankBufferReset; the call is made once more
//     threads=N        N comm ranks as threads of this process (lowrankCommInitRank), not from env
//     exact-only       no compressed call expected (a warm-up); by default none is an error
//   PATH templates: {r} the comm rank, {r1} the next comm rank (mod size), {b} the buffer (0, 1).
//
// Exit codes: 0 success (or the expected error), 1 an unexpected result, 2 usage, 3 error in loop.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
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

// ---- ckpt ------------------------------------------------------------------------------------

struct CkptOpts {
  int first = 0, calls = 0, pre = 0, threads = 0;
  std::string out, save, restore;
  std::vector<std::string> tries;
  bool beforeLayout = false, retry = false, exactOnly = false;
  std::vector<int> ranks;  // empty: every comm rank restores
};

std::vector<BufSpec> ckptBuffers() {
  return {
      {lowrankFloat32, lowrankAvg, 48 * 40 + 40 + 32 * 24, false,
       {{{48, 40}}, {{40}}, {{32, 24}}}},                        // per tensor: weight, bias, weight
      {lowrankBfloat16, lowrankSum, 3000, true, {}},              // batched, in place
  };
}

std::string expand(std::string t, int rank, int n, int buf) {
  const std::pair<const char*, int> subs[] = {{"{r1}", (rank + 1) % n}, {"{r}", rank}, {"{b}", buf}};
  for (const auto& [key, v] : subs)
    for (size_t at; (at = t.find(key)) != std::string::npos;)
      t.replace(at, std::strlen(key), std::to_string(v));
  return t;
}

bool readFile(const std::string& path, std::string* data) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char chunk[65536];
  size_t got;
  data->clear();
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) data->append(chunk, got);
  return std::fclose(f) == 0;
}

void fill(const BufSpec& s, int rank, int call, int buf, std::vector<uint8_t>* in) {
  for (size_t i = 0; i < s.count; ++i) {
    float v = input(rank, call, buf, i);
    if (s.dtype == lowrankFloat32) {
      std::memcpy(in->data() + 4 * i, &v, 4);
    } else {
      uint16_t h = toBf16(v);
      std::memcpy(in->data() + 2 * i, &h, 2);
    }
  }
}

// One comm rank of `mp_worker ckpt`: 0 on success; messages to stdout as "<tag> ..." lines.
int ckptRank(lowrankComm_t comm, const CkptOpts& o) {
  int rank = -1, n = 0;
  lowrankCommUserRank(comm, &rank);
  lowrankCommCount(comm, &n);
  auto say = [&](const std::string& line) {
    std::printf("[%d] %s\n", rank, line.c_str());
    std::fflush(stdout);
  };
  auto fail = [&](const std::string& what) {
    say("FAILED " + what);
    return 1;
  };
  const auto specs = ckptBuffers();
  std::vector<Buffers> bufs(specs.size());
  for (size_t b = 0; b < specs.size(); ++b) {
    const size_t esz = specs[b].dtype == lowrankFloat32 ? 4 : 2;
    bufs[b].send.resize(specs[b].count * esz);
    bufs[b].recv.resize(specs[b].count * esz);
  }
  auto setLayouts = [&]() -> bool {
    for (size_t b = 0; b < specs.size(); ++b) {
      if (specs[b].layout.empty()) continue;
      std::vector<int> ndims;
      std::vector<const size_t*> shapes;
      for (const Tensor& t : specs[b].layout) {
        ndims.push_back(int(t.shape.size()));
        shapes.push_back(t.shape.data());
      }
      if (lowrankBufferSetLayout(comm, bufs[b].recv.data(), int(ndims.size()), ndims.data(),
                                 shapes.data()) != lowrankSuccess)
        return false;
    }
    return true;
  };
  auto call = [&](size_t b, int c) {
    const BufSpec& s = specs[b];
    Buffers& B = bufs[b];
    std::vector<uint8_t>& in = s.inPlace ? B.recv : B.send;
    fill(s, rank, c, int(b), &in);
    return lowrankAllReduce(in.data(), B.recv.data(), s.count, s.dtype, s.op, comm, nullptr);
  };
  const bool restoring =
      o.ranks.empty() || std::find(o.ranks.begin(), o.ranks.end(), rank) != o.ranks.end();
  auto restore = [&]() -> bool {
    for (size_t b = 0; b < specs.size() && !o.restore.empty() && restoring; ++b) {
      const std::string path = expand(o.restore, rank, n, int(b));
      std::string bytes;
      if (!readFile(path, &bytes)) return fail("cannot read " + path), false;
      lowrankResult_t r = lowrankBufferRestoreState(comm, bufs[b].recv.data(), bytes.data(),
                                                    bytes.size());
      if (r != lowrankSuccess)
        return fail("restore of buffer " + std::to_string(b) + " from " + path + ": " +
                    lowrankGetErrorString(r) + ": " + lowrankGetLastError(comm)),
               false;
      say("RESTORED b" + std::to_string(b) + " " + std::to_string(bytes.size()) + " bytes");
    }
    for (const std::string& t : o.tries)
      for (size_t b = 0; b < specs.size(); ++b) {
        const std::string path = expand(t, rank, n, int(b));
        std::string bytes;
        if (!readFile(path, &bytes)) return fail("cannot read " + path), false;
        lowrankResult_t r = lowrankBufferRestoreState(comm, bufs[b].recv.data(), bytes.data(),
                                                      bytes.size());
        say("TRY b" + std::to_string(b) + " " + std::to_string(int(r)) + ": " +
            (r ? lowrankGetLastError(comm) : ""));
      }
    return true;
  };

  if (o.beforeLayout && !restore()) return 1;
  if (!setLayouts()) return fail(std::string("lowrankBufferSetLayout: ") + lowrankGetLastError(comm));
  for (int c = 0; c < o.pre; ++c)
    for (size_t b = 0; b < specs.size(); ++b)
      if (lowrankResult_t r = call(b, 1000 + c))
        return fail("pre call " + std::to_string(c) + ": " + lowrankGetErrorString(r) + ": " +
                    lowrankGetLastError(comm));
  if (!o.beforeLayout && !restore()) return 1;

  std::string out;
  for (int c = o.first; c < o.first + o.calls; ++c)
    for (size_t b = 0; b < specs.size(); ++b) {
      lowrankResult_t r = call(b, c);
      if (r != lowrankSuccess && o.retry) {
        say("CALLERR c" + std::to_string(c) + " b" + std::to_string(b) + " " +
            std::to_string(int(r)) + ": " + lowrankGetLastError(comm));
        if (restoring && !o.restore.empty() &&
            lowrankBufferReset(comm, bufs[b].recv.data()) != lowrankSuccess)
          return fail(std::string("lowrankBufferReset: ") + lowrankGetLastError(comm));
        r = call(b, c);
      }
      if (r != lowrankSuccess)
        return fail("call " + std::to_string(c) + " buffer " + std::to_string(b) + ": " +
                    lowrankGetErrorString(r) + ": " + lowrankGetLastError(comm));
      out.append(reinterpret_cast<const char*>(bufs[b].recv.data()), bufs[b].recv.size());
    }

  for (size_t b = 0; b < specs.size() && !o.save.empty(); ++b) {
    const void* key = bufs[b].recv.data();
    size_t need = 0;
    if (lowrankBufferSaveState(comm, key, nullptr, &need) != lowrankSuccess || need == 0)
      return fail(std::string("lowrankBufferSaveState (size): ") + lowrankGetLastError(comm));
    std::string bytes(need + 16, '\xee');  // more room than needed: *size says what was written
    size_t size = bytes.size();
    if (lowrankBufferSaveState(comm, key, bytes.data(), &size) != lowrankSuccess)
      return fail(std::string("lowrankBufferSaveState: ") + lowrankGetLastError(comm));
    if (size != need) return fail("lowrankBufferSaveState wrote a size other than the one asked");
    bytes.resize(size);
    const std::string path = expand(o.save, rank, n, int(b));
    if (!writeFile(path, bytes)) return fail("cannot write " + path);
    say("SAVED b" + std::to_string(b) + " " + std::to_string(size) + " bytes");
  }
  lowrankStats_t st;
  if (lowrankGetStats(comm, &st) != lowrankSuccess)
    return fail(std::string("lowrankGetStats: ") + lowrankGetLastError(comm));
  if (o.calls > 0 && !o.exactOnly && st.compressedCalls == 0)
    return fail("no call was compressed: the test would prove nothing");
  if (o.exactOnly && st.compressedCalls != 0) return fail("a call was compressed in the warm-up");
  if (!o.out.empty() && !writeFile(o.out + "." + std::to_string(rank), out))
    return fail("cannot write the outputs");
  say("OK " + std::to_string(o.calls) + " calls from " + std::to_string(o.first));
  return 0;
}

int modeCkpt(int argc, char** argv) {
  if (argc < 4) return 2;
  CkptOpts o;
  o.first = std::atoi(argv[2]);
  o.calls = std::atoi(argv[3]);
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), val = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key == "out") o.out = val;
    else if (key == "save") o.save = val;
    else if (key == "restore") o.restore = val;
    else if (key == "try") o.tries.push_back(val);
    else if (key == "pre") o.pre = std::atoi(val.c_str());
    else if (key == "threads") o.threads = std::atoi(val.c_str());
    else if (a == "before-layout") o.beforeLayout = true;
    else if (a == "retry") o.retry = true;
    else if (a == "exact-only") o.exactOnly = true;
    else if (key == "ranks")
      for (size_t p = 0; p < val.size();) {
        size_t q = val.find(',', p);
        if (q == std::string::npos) q = val.size();
        o.ranks.push_back(std::atoi(val.substr(p, q - p).c_str()));
        p = q + 1;
      }
    else return 2;
  }
  if (o.threads <= 0) {
    lowrankComm_t comm;
    int rank = -1, n = 0;
    if (int r = initFromEnv(&comm, &rank, &n)) return 10 + r;
    int rc = ckptRank(comm, o);
    lowrankCommDestroy(comm);
    return rc;
  }
  lowrankUniqueId id;
  if (lowrankGetUniqueId(&id) != lowrankSuccess) {
    std::fprintf(stderr, "lowrankGetUniqueId: %s\n", lowrankGetLastError(nullptr));
    return 1;
  }
  std::vector<int> rc(size_t(o.threads), 0);
  std::vector<std::thread> th;
  for (int r = 0; r < o.threads; ++r)
    th.emplace_back([&, r] {
      lowrankComm_t comm;
      if (lowrankCommInitRank(&comm, o.threads, id, r) != lowrankSuccess) {
        std::fprintf(stderr, "comm rank %d: init: %s\n", r, lowrankGetLastError(nullptr));
        rc[size_t(r)] = 1;
        return;
      }
      rc[size_t(r)] = ckptRank(comm, o);
      lowrankCommDestroy(comm);
    });
  for (auto& t : th) t.join();
  for (int x : rc)
    if (x) return 1;
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: mp_worker run PREFIX | threads N PREFIX | init | loop ITERS | "
                       "mismatch | fewer CALLS | ckpt FIRST CALLS [OPTION]...\n");
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
  if (mode == "ckpt") {
    int rc = modeCkpt(argc, argv);
    return rc == 2 ? usage() : rc;
  }
  return usage();
}
