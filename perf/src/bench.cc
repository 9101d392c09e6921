#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtypes.h"
#include "inputs.h"
#include "metrics.h"
#include "report.h"
#include "safetensors.h"
#include "triad.h"

namespace perf {

namespace {

// Where comm ranks other than 0 print (their table is not shown; their JSON still is written).
FILE* devNull() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

using Clock = std::chrono::steady_clock;

// LOWRANK_FACTOR_DTYPE's word for lowrankConfig_t.factorDtype.
const char* factorWord(int t) {
  return t == lowrankBfloat16 ? "bf16" : t == lowrankFloat16 ? "fp16" : "fp32";
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

Buffer allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) return nullptr;
  std::memset(p, 0, rounded);
  return Buffer(p);
}

bool compressible(lowrankDataType_t t, lowrankRedOp_t op) {
  return (t == lowrankFloat32 || t == lowrankFloat16 || t == lowrankBfloat16) &&
         (op == lowrankSum || op == lowrankAvg);
}

class Bench {
 public:
  Bench(Harness& h, const Args& a) : h_(h), a_(a) {}
  int run();

 private:
  // One (type, op, size) case: inputs in send_, reference in ref_.
  struct Case {
    lowrankDataType_t type;
    lowrankRedOp_t op;
    size_t count;
    bool gradients;
    bool synthExact;  // synthetic rank-k inputs: the answer is exact
    MatrixView view;  // batched view the perf computed (synthetic)
    std::optional<std::optional<double>> relerrOpt;  // cached per case (rank 0)
  };

  void makeComms();
  void measureTriad();
  void measurePhases(const Case& c, Mode mode, Row& row);
  double timedLoop(int warmup, int iters, const std::function<void()>& body);
  void allocateFor(size_t maxCount, size_t maxTypeSize);
  void prepareReference(const Case& c);
  Row runMode(Case& c, Mode mode);
  void call(Mode mode, const Case& c, const void* send, void* recv);
  lowrankComm_t commOf(Mode mode) const {
    return mode == Mode::PowerSgd ? commK_ : commExact_;
  }
  void* stateBuf(Mode mode) const { return mode == Mode::Fp16 ? tmpRecv_.get() : recv_.get(); }
  lowrankStats_t stats(Mode mode);
  // recvbuff of the next call: with --move the other of the two allocations (FSDP's fresh output)
  void* nextRecv() {
    if (a_.move) std::swap(recv_, recvAlt_);
    return recv_.get();
  }
  void declare(lowrankComm_t comm, const void* buf, const char* what);
  void restoreInPlace(const Case& c) {
    std::memcpy(recv_.get(), send_.get(), c.count * typeSize(c.type));
  }
  std::optional<double> computeRelErrOpt(Case& c);
  void checkView(const Case& c);

  Harness& h_;
  const Args& a_;
  lowrankComm_t commExact_ = nullptr, commK_ = nullptr;
  lowrankComm_t commSolo_ = nullptr;  // this comm rank alone (1 rank, approxRank k): compute_us
  TriadResult triad_;
  Buffer send_, recv_, ref_, acc_, tmpSend_, tmpRecv_;
  Buffer recvAlt_;  // --move: recv_'s other allocation (swapped with it before each call)
  std::vector<lowrankTensor_t> tensors_;  // --ids: the gradients' tensors, ids 0..n-1
  std::optional<Gradients> grads_;
  int startIter_ = 0;
  double rate_ = 2.0;
  bool alternate_ = false;  // LOWRANK_ALTERNATE in force: one factor allreduce per call
  int factorDtype_ = lowrankFloat32;  // LOWRANK_FACTOR_DTYPE in force
  std::unique_ptr<Report> report_;
  bool viewWarned_ = false;
  bool startWarned_ = false;
  std::vector<lowrankDataType_t> types_;  // -d, less those that do not apply
  // --digest: FNV-1a 64 over recvbuff's bytes after each call() of the row, in call order (the
  // --phases loops are not included); rowDigests_: every comm rank's, gathered after the row.
  uint64_t digest_ = kFnvOffset;
  std::vector<uint64_t> rowDigests_;
  static constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
};

int Bench::run() {
  const bool root = h_.localRoot();  // measures; comm rank 0 alone prints the table
  if (root) report_ = std::make_unique<Report>(h_.rank() == 0 ? stdout : devNull());

  // Gradients first: a bad file fails before any communicator exists.
  std::string step = a_.step;
  if (!a_.gradientsDir.empty()) {
    try {
      grads_ = loadGradients(a_.gradientsDir, &step, h_.rank());
    } catch (const std::exception& e) {
      h_.fail(e.what());
    }
    const uint64_t hsh = layoutHash(*grads_);
    if (h_.minU64(hsh) != h_.maxU64(hsh))
      h_.fail("the gradient files of the comm ranks have different tensor layouts");
    for (auto t : a_.types)
      if (isFloating(t)) types_.push_back(t);
    if (types_.empty())
      h_.fail("--gradients needs a floating -d (float, half, bfloat16, double)");
  } else {
    types_ = a_.types;
  }
  makeComms();
  measureTriad();

  if (root) {
    int version = 0;
    lowrankGetVersion(&version);
    report_->note("lowrank_allreduce_perf: " + a_.commandLine);
    char line[512];
    std::snprintf(line, sizeof line, a_.stepFactor > 1 ? "%g(factor)" : "%.0f(bytes)",
                  a_.stepFactor > 1 ? a_.stepFactor : static_cast<double>(a_.stepBytes));
    const std::string stepText = line;
    std::snprintf(line, sizeof line,
                  "nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %s warmup iters: %d "
                  "iters: %d agg iters: 1 validation: %d graph: 0",
                  a_.nthreads, grads_ ? grads_->count() * typeSize(types_[0]) : a_.minBytes,
                  grads_ ? grads_->count() * typeSize(types_[0]) : a_.maxBytes,
                  stepText.c_str(), a_.warmup, a_.iters, a_.check ? 1 : 0);
    report_->note(line);
    std::snprintf(line, sizeof line,
                  "lowrank version %d.%d.%d, comm ranks %d (%s), approximation rank k %d, rounds "
                  "%d, start iter %d, min compression rate %g, schedule %s, factors %s on the wire",
                  version / 10000, version / 100 % 100, version % 100, h_.nranks(), h_.kind(),
                  a_.approxRank, a_.rounds, startIter_, rate_,
                  alternate_ ? "alternating (ACP-SGD: one factor allreduce per call)" : "PowerSGD",
                  factorWord(factorDtype_));
    report_->note(line);
    if (triad_.alone && triad_.shared) {
      std::snprintf(line, sizeof line,
                    "triad: %.2f GB/s (a = b + s*c, float32, 3 x %zu MiB, 1 thread alone, best of "
                    "5); %.2f GB/s per comm rank with %d running it at once",
                    *triad_.alone, a_.triadMib, *triad_.shared, triad_.concurrent);
      report_->note(line);
    } else {
      report_->note("triad: not measured (--triad-mib 0): no bandwidth bound");
    }
    report_->setTriad(triad_);
    if (grads_) {
      size_t ncomp = 0;
      for (const auto& s : grads_->shapes) {
        if (s.size() < 2) continue;
        size_t m = 1;
        for (size_t d = 1; d < s.size(); ++d) m *= s[d];
        if (isCompressed(s[0], m, a_.approxRank, rate_)) ++ncomp;
      }
      std::snprintf(line, sizeof line,
                    "gradients: %s step %s, %zu tensors (%zu compressed at k %d), %zu elements",
                    a_.gradientsDir.c_str(), step.c_str(), grads_->shapes.size(), ncomp,
                    a_.approxRank, grads_->count());
      report_->note(line);
    }
    if (std::string(h_.kind()) == "threads") {  // every rank is a thread of this process
      for (int r = 0; r < h_.nranks(); ++r) {
        std::snprintf(line, sizeof line, " Rank %2d Group  0 Pid %6d on host device -1 [cpu]", r,
                      static_cast<int>(getpid()));
        report_->note(line);
      }
    }
    if (types_.size() != a_.types.size())
      report_->note("integer -d types skipped: the gradients are floating point");
    report_->header();
  }

  // Sizes
  std::vector<size_t> sizes;
  if (!grads_) {
    for (size_t s = a_.minBytes; s <= a_.maxBytes;) {
      sizes.push_back(s);
      size_t next = a_.stepFactor > 1 ? static_cast<size_t>(static_cast<double>(s) * a_.stepFactor)
                                      : s + a_.stepBytes;
      if (next <= s) next = s + 1;
      s = next;
    }
  }
  size_t maxCount = 0, maxTs = 1;
  for (auto t : types_) {
    maxTs = std::max(maxTs, typeSize(t));
    if (grads_) maxCount = std::max(maxCount, grads_->count());
    for (size_t s : sizes) maxCount = std::max(maxCount, s / typeSize(t));
  }
  allocateFor(maxCount, maxTs);

  bool fp16Skipped = false;
  for (auto type : types_) {
    for (auto op : a_.ops) {
      std::vector<size_t> counts;
      if (grads_) counts.push_back(grads_->count());
      else
        for (size_t s : sizes) {
          if (s / typeSize(type) > 0) counts.push_back(s / typeSize(type));
          else if (root)
            report_->note("size " + std::to_string(s) + " B holds no " + typeName(type) +
                          " element: skipped");
        }
      for (size_t count : counts) {
        Case c{type, op, count, grads_.has_value(), false, {}, std::nullopt};
        if (grads_) {
          fromFloat(grads_->data.data(), count, type, send_.get());
        } else {
          SyntheticSpec spec;
          spec.type = type;
          spec.op = op;
          spec.exactRankK = a_.check;
          spec.k = std::max(1, a_.approxRank);
          spec.seed = a_.seed;
          spec.view = c.view = batchedView(count);
          makeSynthetic(send_.get(), count, h_.rank(), spec);
          c.synthExact = a_.check;
        }
        prepareReference(c);
        for (Mode mode : a_.modes) {
          if (mode == Mode::Fp16 && type != lowrankFloat32) {
            if (root && !fp16Skipped) report_->note("mode fp16 applies to -d float only: skipped");
            fp16Skipped = true;
            continue;
          }
          Row r = runMode(c, mode);
          if (root) report_->row(r);
          if (root && a_.digest) {
            for (int rk = 0; rk < h_.nranks(); ++rk) {
              char line[160];
              std::snprintf(line, sizeof line, "digest %s %s %s count %zu rank %d fnv1a64 %016llx",
                            modeName(mode), typeName(type), opName(op), count, rk,
                            static_cast<unsigned long long>(rowDigests_[rk]));
              report_->note(line);
            }
          }
        }
      }
    }
  }

  if (root) {  // what the transport measured and chose (lowrankCommGetTransportInfo), per comm
    for (auto [name, comm] : {std::pair<const char*, lowrankComm_t>{"exact", commExact_},
                              {"powersgd", commK_}}) {
      if (!comm) continue;
      size_t needed = 0;
      h_.check(lowrankCommGetTransportInfo(comm, nullptr, 0, &needed), comm,
               "lowrankCommGetTransportInfo");
      std::string info(needed, '\0');
      h_.check(lowrankCommGetTransportInfo(comm, info.data(), info.size(), nullptr), comm,
               "lowrankCommGetTransportInfo");
      info.pop_back();
      report_->note(std::string("transport (") + name + " comm, comm rank 0): " + info);
    }
  }

  int status = 0;
  if (root) {
    const uint64_t oob = report_->footer();
    if (!a_.jsonFile.empty() && !report_->writeJson(a_.jsonFile, a_, h_.nranks())) status = 1;
    if (oob) status = 1;
  }
  h_.barrier();
  if (commSolo_) lowrankCommDestroy(commSolo_);
  if (commK_) lowrankCommDestroy(commK_);
  if (commExact_) lowrankCommDestroy(commExact_);
  return status;
}

void Bench::makeComms() {
  // Comm ranks as threads of one process share its links: nothing to measure, and their results
  // must not depend on timing (issue 40). The user's own setting wins.
  if (std::string(h_.kind()) == "threads") setenv("LOWRANK_UCX_PROBE", "0", 0);
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 0;  // every call exact: the reference (Float64), modes exact and fp16
  h_.check(h_.commInit(&cfg, &commExact_), nullptr, "lowrankCommInitRankConfig (exact)");
  if (std::find(a_.modes.begin(), a_.modes.end(), Mode::PowerSgd) != a_.modes.end()) {
    lowrankConfig_t cfgK = LOWRANK_CONFIG_INITIALIZER;
    cfgK.approxRank = a_.approxRank;
    h_.check(h_.commInit(&cfgK, &commK_), nullptr, "lowrankCommInitRankConfig (powersgd)");
    // The start iteration and compression rate in force (from LOWRANK_* when set) decide which
    // calls are exact and which tensors are compressed: ask the library rather than re-parse.
    lowrankConfig_t inForce = LOWRANK_CONFIG_INITIALIZER;
    h_.check(lowrankCommGetConfig(commK_, &inForce), commK_, "lowrankCommGetConfig");
    startIter_ = inForce.startIter;
    rate_ = inForce.minCompressionRate;
    alternate_ = inForce.alternate == 1;
    factorDtype_ = inForce.factorDtype;
    if (a_.phases) {
      // compute_us: the same compressed allreduce on a communicator of this comm rank alone (the
      // transport has nothing to do for one rank), every comm rank at once. Not collective.
      lowrankUniqueId id;
      h_.check(lowrankGetUniqueId(&id), nullptr, "lowrankGetUniqueId (1-rank communicator)");
      lowrankConfig_t cfgSolo = LOWRANK_CONFIG_INITIALIZER;
      cfgSolo.approxRank = a_.approxRank;
      h_.check(lowrankCommInitRankConfig(&commSolo_, 1, id, 0, &cfgSolo), nullptr,
               "lowrankCommInitRankConfig (1-rank communicator)");
    }
  }
}

void Bench::measureTriad() {
  if (a_.triadMib == 0) return;
  constexpr int kRepeats = 5;
  auto t = std::make_unique<Triad>(a_.triadMib);
  if (h_.minU64(t->ok() ? 1 : 0) == 0) h_.fail("out of memory for the triad's arrays");
  // Alone: one thread on an otherwise idle machine (as far as this run goes). Threads: comm rank 0
  // measures while the others wait. Processes (maybe on one machine): each in turn.
  const bool processes = std::string(h_.kind()) == "processes";
  for (int r = 0; r < (processes ? h_.nranks() : 1); ++r) {
    h_.barrier();
    if (h_.rank() == r) {
      double best = 1e30;
      for (int i = 0; i < kRepeats; ++i) best = std::min(best, t->once());
      triad_.alone = t->bytesPerPass() / best / 1e9;
    }
  }
  // Shared: every comm rank at once, as their compute runs: kRepeats passes between two barriers,
  // best of 3 such rounds; the bandwidth one comm rank gets, the smallest over the ranks.
  double bestShared = 0;
  for (int round = 0; round < 3; ++round) {
    h_.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < kRepeats; ++i) t->once();
    h_.barrier();
    bestShared = std::max(bestShared, kRepeats * t->bytesPerPass() / secondsSince(t0) / 1e9);
  }
  triad_.shared = -h_.maxDouble(-bestShared);
  triad_.concurrent = h_.nranks();
  h_.barrier();
}

double Bench::timedLoop(int warmup, int iters, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) body();
  h_.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) body();
  return h_.maxDouble(secondsSince(t0) / iters);
}

void Bench::measurePhases(const Case& c, Mode mode, Row& row) {
  const double ts = static_cast<double>(typeSize(c.type));
  auto setBound = [&](double bytes) {
    if (!triad_.shared || !triad_.alone || !row.computeUs) return;
    row.boundUs = bytes / (*triad_.shared * 1e9) * 1e6;
    row.boundAloneUs = bytes / (*triad_.alone * 1e9) * 1e6;
    if (*row.computeUs > 0) row.computeEff = *row.boundUs / *row.computeUs;
  };
  const bool compressed = mode == Mode::PowerSgd && a_.approxRank > 0 &&
                          compressible(c.type, c.op) && commSolo_;
  if (mode == Mode::Fp16) {
    // compute: the two casts alone; comm: the half allreduce alone
    float* out = static_cast<float*>(recv_.get());
    uint16_t* hs = static_cast<uint16_t*>(tmpSend_.get());
    uint16_t* hr = static_cast<uint16_t*>(tmpRecv_.get());
    row.computeUs = 1e6 * timedLoop(1, a_.iters, [&] {
      floatToHalfN(static_cast<const float*>(send_.get()), hs, c.count);
      halfToFloatN(hr, out, c.count);
    });
    row.commUs = 1e6 * timedLoop(1, a_.iters, [&] {
      h_.check(lowrankAllReduce(hs, hr, c.count, lowrankFloat16, c.op, commExact_, nullptr),
               commExact_, "lowrankAllReduce (fp16 comm phase)");
    });
    setBound(12.0 * static_cast<double>(c.count));  // read 4 write 2, read 2 write 4
    return;
  }
  if (!compressed) {  // exact: no compute, the allreduce is all communication
    row.computeUs = 0.0;
    row.commUs = row.outOfPlace.timeUs;
    return;
  }
  lowrankBufferView_t v{};
  h_.check(lowrankBufferGetView(commK_, recv_.get(), &v), commK_, "lowrankBufferGetView");
  if (h_.minU64(v.planned ? 1 : 0) == 0) return;
  // Nothing to compress at this size and rank (every tensor fails the compression test): the row
  // is an exact allreduce, and there is no compression phase to time.
  if (h_.minU64(uint64_t(v.ncompressed)) == 0) return;
  row.pElements = v.pElements;
  row.qElements = v.qElements;
  row.exactElements = v.exactElements;

  // compute: the same call on this comm rank's own 1-rank communicator, all comm ranks at once
  lowrankStats_t s0{}, s1{};
  h_.check(lowrankGetStats(commSolo_, &s0), commSolo_, "lowrankGetStats");
  size_t soloCalls = 0;
  const double computeSec =
      timedLoop(std::max(a_.warmup, startIter_ + 1), a_.iters, [&] {
        void* out = a_.move && soloCalls++ % 2 ? recvAlt_.get() : recv_.get();  // recv_ stays
        if (a_.move) declare(commSolo_, out, "lowrankBufferSetTensors (1-rank communicator)");
        h_.check(lowrankAllReduce(send_.get(), out, c.count, c.type, c.op, commSolo_, nullptr),
                 commSolo_, "lowrankAllReduce (1-rank communicator, compute phase)");
      });
  h_.check(lowrankGetStats(commSolo_, &s1), commSolo_, "lowrankGetStats");
  const uint64_t needed = static_cast<uint64_t>(a_.iters);
  if (h_.minU64(s1.compressedCalls - s0.compressedCalls) >= needed) {
    row.computeUs = 1e6 * computeSec;
  } else if (h_.rank() == 0) {
    std::fprintf(stderr,
                 "lowrank_allreduce_perf: warning: the 1-rank communicator did not compress "
                 "every timed call: no compute_us\n");
  }

  // comm: the factor payload alone, exact float32 allreduces on the real communicator: the exact
  // part with P (+1: the flag carried with P), then Q, back to back. Alternating: the same two,
  // each a call's only allreduce (the exact part and the checks with Q too): half the pair is a call.
  // 16-bit factors: the same bytes (a factor element is half a float32 one), the same messages.
  const size_t p = factorDtype_ == lowrankFloat32 ? v.pElements : (v.pElements + 1) / 2,
               q = factorDtype_ == lowrankFloat32 ? v.qElements : (v.qElements + 1) / 2;
  const size_t n1 = p + v.exactElements + 1, n2 = q + (alternate_ ? v.exactElements + 2 : 0);
  std::vector<float> f1(n1, 1.f), f2(std::max<size_t>(n2, 1), 1.f);
  row.commUs = (alternate_ ? 0.5e6 : 1e6) * timedLoop(std::max(1, std::min(a_.warmup, 3)), a_.iters, [&] {
    h_.check(lowrankAllReduce(f1.data(), f1.data(), n1, lowrankFloat32, lowrankSum, commExact_,
                              nullptr),
             commExact_, "lowrankAllReduce (comm phase, P + exact part)");
    if (n2)
      h_.check(lowrankAllReduce(f2.data(), f2.data(), n2, lowrankFloat32, lowrankSum, commExact_,
                                nullptr),
               commExact_, "lowrankAllReduce (comm phase, Q)");
  });

  // bound: 3 fused passes over the compressed elements (G and E read, M written; M read; M read,
  // E and out written: 20 B of float32 state + 2 x the dtype's size), the exact part read + written.
  // Alternating: each step one fused pass (G and E read, E written: 8 B + the dtype; the Q step's
  // residual is taken by the next P step's pass: kernels/host/powersgd_kernels.h, deferResidual),
  // the output written (the dtype): 8 B + 2 x dtype per element, P step or Q step.
  const double exactEl = static_cast<double>(v.exactElements);
  const double compEl = static_cast<double>(c.count) - exactEl;
  setBound(compEl * ((alternate_ ? 8.0 : 20.0) + 2.0 * ts) + exactEl * 2.0 * ts);
}

// Bytes of memory the system can still give (MemAvailable), or 0 if unknown.
uint64_t memAvailable() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return uint64_t(kb) * 1024;
}

void Bench::allocateFor(size_t maxCount, size_t maxTs) {
  // Refuse a size that cannot fit rather than be killed by the OOM killer mid-run: per comm rank
  // of this process send, recv and the float64 reference, plus the state of its two compressing
  // communicators (a float32 residual each); one float64 accumulator per process.
  const double ranksHere = std::strcmp(h_.kind(), "threads") == 0 ? h_.nranks() : 1;
  const double need = ranksHere * double(maxCount) * ((a_.move ? 3.0 : 2.0) * double(maxTs) + 16) +
                      8.0 * double(maxCount);
  if (const uint64_t avail = memAvailable(); avail && need > 0.9 * double(avail))
    h_.fail("the largest size needs about " + std::to_string(int(need / (1 << 30) + 0.5)) +
            " GiB of memory for " + std::to_string(int(ranksHere)) + " comm rank(s) here, and " +
            std::to_string(int(double(avail) / (1 << 30))) +
            " GiB are available (10% kept spare): lower -e (or -t)");
  send_ = allocate(maxCount * maxTs);
  recv_ = allocate(maxCount * maxTs);
  if (a_.move) recvAlt_ = allocate(maxCount * maxTs);
  ref_ = allocate(maxCount * sizeof(double));
  if (h_.localRoot()) acc_ = allocate(maxCount * sizeof(double));
  const bool fp16 = std::find(a_.modes.begin(), a_.modes.end(), Mode::Fp16) != a_.modes.end();
  if (fp16) {
    tmpSend_ = allocate(maxCount * sizeof(uint16_t));
    tmpRecv_ = allocate(maxCount * sizeof(uint16_t));
  }
  if (!send_ || !recv_ || (a_.move && !recvAlt_) || !ref_ || (h_.localRoot() && !acc_) ||
      (fp16 && (!tmpSend_ || !tmpRecv_)))
    h_.fail("out of memory for buffers of " + std::to_string(maxCount) + " elements");
  if (grads_ && commK_) {
    // the layout of the real gradients: per-tensor mode on the PowerSGD comm's recvbuff
    for (size_t i = 0; a_.ids && i < grads_->shapes.size(); ++i) {
      const auto& s = grads_->shapes[i];
      if (s.size() > LOWRANK_MAX_DIMS) h_.fail("--ids: a tensor has more than LOWRANK_MAX_DIMS dims");
      lowrankTensor_t t{};
      t.id = i;
      t.ndims = static_cast<int>(s.size());
      std::copy(s.begin(), s.end(), t.shape);
      t.approxRank = LOWRANK_RANK_DEFAULT;
      tensors_.push_back(t);
    }
    declare(commK_, recv_.get(), "lowrankBufferSetLayout");
    if (commSolo_) declare(commSolo_, recv_.get(), "lowrankBufferSetLayout (1-rank communicator)");
  }
}

// The gradients' tensors on buf: with ids (--ids), else as an anonymous layout.
void Bench::declare(lowrankComm_t comm, const void* buf, const char* what) {
  if (a_.ids) {
    h_.check(lowrankBufferSetTensors(comm, buf, static_cast<int>(tensors_.size()),
                                     tensors_.data()),
             comm, what);
    return;
  }
  std::vector<int> ndims;
  std::vector<const size_t*> shapes;
  for (const auto& s : grads_->shapes) {
    ndims.push_back(static_cast<int>(s.size()));
    shapes.push_back(s.data());
  }
  h_.check(lowrankBufferSetLayout(comm, buf, static_cast<int>(ndims.size()), ndims.data(),
                                  shapes.data()),
           comm, what);
}

void Bench::prepareReference(const Case& c) {
  // ref = the exact allreduce of the inputs (as the library sees them, after rounding to the
  // dtype), computed by the library itself in Float64 (always exact).
  double* ref = static_cast<double*>(ref_.get());
  toDouble(send_.get(), c.type, c.count, ref);
  h_.check(lowrankAllReduce(ref, ref, c.count, lowrankFloat64, c.op, commExact_, nullptr),
           commExact_, "lowrankAllReduce (Float64 reference)");
  if (c.op == lowrankAvg && !isFloating(c.type))  // integer avg: sum / N truncated, as in C
    for (size_t i = 0; i < c.count; ++i) ref[i] = std::trunc(ref[i]);
}

void Bench::call(Mode mode, const Case& c, const void* send, void* recv) {
  lowrankResult_t r;
  if (mode == Mode::Fp16) {
    uint16_t* tr = static_cast<uint16_t*>(tmpRecv_.get());
    uint16_t* ts = send == recv ? tr : static_cast<uint16_t*>(tmpSend_.get());
    floatToHalfN(static_cast<const float*>(send), ts, c.count);
    r = lowrankAllReduce(ts, tr, c.count, lowrankFloat16, c.op, commExact_, nullptr);
    halfToFloatN(tr, static_cast<float*>(recv), c.count);
  } else {
    if (a_.move && mode == Mode::PowerSgd)  // FSDP: the same ids on a fresh output, every call
      declare(commK_, recv, "lowrankBufferSetTensors");
    r = lowrankAllReduce(send, recv, c.count, c.type, c.op, commOf(mode), nullptr);
  }
  h_.check(r, commOf(mode), "lowrankAllReduce");
  if (a_.digest) {
    const unsigned char* p = static_cast<const unsigned char*>(recv);
    for (size_t i = 0, n = c.count * typeSize(c.type); i < n; ++i)
      digest_ = (digest_ ^ p[i]) * 0x100000001b3ull;  // FNV-1a 64
  }
}

lowrankStats_t Bench::stats(Mode mode) {
  lowrankStats_t s{};
  h_.check(lowrankGetStats(commOf(mode), &s), commOf(mode), "lowrankGetStats");
  return s;
}

void Bench::checkView(const Case& c) {
  if (viewWarned_ || h_.rank() != 0 || !commK_) return;
  lowrankBufferView_t v{};
  if (lowrankBufferGetView(commK_, recv_.get(), &v) != lowrankSuccess || !v.planned) return;
  if (c.gradients) {
    if (!v.perTensor || v.ntensors != static_cast<int>(grads_->shapes.size())) {
      std::fprintf(stderr,
                   "lowrank_allreduce_perf: warning: the library's view is perTensor %d ntensors "
                   "%d, the layout set has %zu tensors\n",
                   v.perTensor, v.ntensors, grads_->shapes.size());
      viewWarned_ = true;
    }
  } else if (v.perTensor || v.rows != c.view.rows || v.cols != c.view.cols) {
    std::fprintf(stderr,
                 "lowrank_allreduce_perf: warning: count %zu: the library views the buffer as "
                 "%zu x %zu (padded %zu), the perf as %zu x %zu (padded %zu); the synthetic "
                 "rank-k inputs assume the latter\n",
                 c.count, v.rows, v.cols, v.padded, c.view.rows, c.view.cols, c.view.padded);
    viewWarned_ = true;
  }
}

std::optional<double> Bench::computeRelErrOpt(Case& c) {
  if (c.relerrOpt) return *c.relerrOpt;
  std::vector<MatrixSlice> mats;
  if (c.gradients) {
    size_t off = 0;
    for (const auto& s : grads_->shapes) {
      size_t n = 1;
      for (size_t d : s) n *= d;
      if (s.size() >= 2) mats.push_back({off, s[0], n / s[0]});
      off += n;
    }
  } else {
    MatrixSlice m{0, c.view.rows, c.view.cols};
    lowrankBufferView_t v{};
    if (commK_ && lowrankBufferGetView(commK_, recv_.get(), &v) == lowrankSuccess && v.planned &&
        !v.perTensor && v.rows * v.cols >= c.count) {
      m.rows = v.rows;  // the library's own view, when it reports one
      m.cols = v.cols;
    }
    mats.push_back(m);
  }
  c.relerrOpt = relErrOpt(static_cast<const double*>(ref_.get()), c.count, mats, a_.approxRank,
                          rate_);
  return *c.relerrOpt;
}

Row Bench::runMode(Case& c, Mode mode) {
  const bool root = h_.localRoot();
  const int n = h_.nranks();
  Row row;
  row.count = c.count;
  row.size = c.count * typeSize(c.type);
  row.type = c.type;
  row.op = c.op;
  row.mode = mode;
  row.k = mode == Mode::PowerSgd ? a_.approxRank : 0;
  row.alternate = mode == Mode::PowerSgd && alternate_;
  if (mode == Mode::PowerSgd) row.factorDtype = factorWord(factorDtype_);
  digest_ = kFnvOffset;
  void* send = send_.get();
  void* recv = nullptr;  // recv_ at the last call (--move: it changes at every call)
  const double* ref = static_cast<const double*>(ref_.get());
  const double busFactor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  auto fill = [&](Placement& p, double seconds) {
    p.timeUs = seconds * 1e6;
    p.algBw = seconds > 0 ? static_cast<double>(row.size) / 1e9 / seconds : 0.0;
    p.busBw = p.algBw * busFactor;
  };

  // ---- timing, out-of-place: the whole loop, after a barrier; max over comm ranks
  for (int i = 0; i < a_.warmup; ++i) call(mode, c, send, nextRecv());
  h_.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < a_.iters; ++i) call(mode, c, send, nextRecv());
  fill(row.outOfPlace, h_.maxDouble(secondsSince(t0) / a_.iters));

  // ---- timing, in-place (recvbuff as sendbuff): the input is restored before each call (not
  // timed) so that repeated sums cannot overflow into Inf and change what the library does; a
  // barrier after it, so that no rank's timed call runs beside another rank's restore (comm ranks
  // as threads share the memory bandwidth)
  for (int i = 0; i < a_.warmup; ++i) {
    recv = nextRecv();
    restoreInPlace(c);
    call(mode, c, recv, recv);
  }
  h_.barrier();
  double inPlaceSec = 0;
  for (int i = 0; i < a_.iters; ++i) {
    recv = nextRecv();
    restoreInPlace(c);
    h_.barrier();
    t0 = Clock::now();
    call(mode, c, recv, recv);
    inPlaceSec += secondsSince(t0);
  }
  fill(row.inPlace, h_.maxDouble(inPlaceSec / a_.iters));

  // ---- each phase alone: compute_us, comm_us, and the bandwidth bound of the compute
  if (a_.phases) measurePhases(c, mode, row);

  // Rows whose answer is exact up to the tolerance: synthetic rank-k inputs, or modes that do not
  // approximate. Only those count #wrong; an approximation of real gradients shows N/A there.
  // Alternating PowerSGD is exact on rank-k inputs by pairs of calls only (docs/design.md).
  row.expectExact = (c.synthExact && !alternate_) || mode != Mode::PowerSgd ||
                    !compressible(c.type, c.op) || a_.approxRank == 0;
  const bool check = a_.check && row.expectExact;

  // ---- accuracy, out-of-place, from a fresh buffer state
  const double tolAbs = isFloating(c.type)
                            ? relTolerance(mode, c.type, factorDtype_) * maxAbs(ref, c.count)
                            : (c.op == lowrankAvg ? 1.0 : 0.0);
  h_.check(lowrankBufferReset(commOf(mode), stateBuf(mode)), commOf(mode), "lowrankBufferReset");
  h_.barrier();
  const lowrankStats_t sw = stats(mode);
  for (int i = 0; i < startIter_; ++i) call(mode, c, send, nextRecv());  // exact warm-up calls
  const lowrankStats_t s0 = stats(mode);
  if (s0.compressedCalls != sw.compressedCalls && root && !startWarned_) {
    std::fprintf(stderr,
                 "lowrank_allreduce_perf: warning: %d of the %d start-iter calls after "
                 "lowrankBufferReset were compressed: the measured call is not the first\n",
                 static_cast<int>(s0.compressedCalls - sw.compressedCalls), startIter_);
    startWarned_ = true;
  }
  call(mode, c, send, recv = nextRecv());
  lowrankStats_t s1 = stats(mode);
  if (mode == Mode::PowerSgd && alternate_ && s1.compressedCalls > s0.compressedCalls) {
    // Alternating: a P step and a Q step make the call's bytes (reported per call, their mean);
    // relerr stays the first call's, checked below.
    std::vector<char> keep(c.count * typeSize(c.type));
    std::memcpy(keep.data(), recv, keep.size());
    call(mode, c, send, nextRecv());
    const lowrankStats_t s2 = stats(mode);
    std::memcpy(recv, keep.data(), keep.size());
    s1.compressedElements = s0.compressedElements + (s2.compressedElements - s0.compressedElements) / 2;
    s1.exactElements = s0.exactElements + (s2.exactElements - s0.exactElements) / 2;
    s1.payloadElements = s0.payloadElements + (s2.payloadElements - s0.payloadElements) / 2;
    s1.bytesSent = s0.bytesSent + (s2.bytesSent - s0.bytesSent) / 2;
  }
  const uint64_t elems =
      (s1.compressedElements + s1.exactElements) - (s0.compressedElements + s0.exactElements);
  const uint64_t payload = s1.payloadElements - s0.payloadElements;
  if (payload > 0 && elems > 0) {
    double ratio = static_cast<double>(elems) / static_cast<double>(payload);
    if (mode == Mode::Fp16) ratio *= 2.0;  // half on the wire for float32 data: bytes ratio
    row.ratio = ratio;
  }
  row.wireBytes = s1.bytesSent - s0.bytesSent;
  if (mode == Mode::PowerSgd) checkView(c);
  if (check) row.outOfPlace.nwrong = h_.sumU64(countWrong(recv, c.type, ref, c.count, tolAbs));
  double* acc = static_cast<double*>(acc_.get());
  if (root) {
    row.relerr = relErr(recv, c.type, ref, c.count);
    toDouble(recv, c.type, c.count, acc);
  }
  for (int r = 1; r < a_.rounds; ++r) {
    call(mode, c, send, recv = nextRecv());
    if (root)
      for (size_t i = 0; i < c.count; ++i) acc[i] += loadAsDouble(recv, c.type, i);
  }
  if (root) row.cumrelerr = relErrDouble(acc, ref, static_cast<double>(a_.rounds), c.count);
  if (root && mode == Mode::PowerSgd && a_.approxRank > 0 && compressible(c.type, c.op))
    row.relerrOpt = computeRelErrOpt(c);

  // ---- correctness, in-place, from a fresh buffer state
  if (check) {
    h_.check(lowrankBufferReset(commOf(mode), stateBuf(mode)), commOf(mode), "lowrankBufferReset");
    h_.barrier();
    for (int i = 0; i < startIter_; ++i) {
      recv = nextRecv();
      restoreInPlace(c);
      call(mode, c, recv, recv);
    }
    recv = nextRecv();
    restoreInPlace(c);
    call(mode, c, recv, recv);
    row.inPlace.nwrong = h_.sumU64(countWrong(recv, c.type, ref, c.count, tolAbs));
  }
  if (a_.digest) {  // every comm rank's, to rank 0: one max per rank, the others giving 0
    rowDigests_.assign(n, 0);
    for (int r = 0; r < n; ++r) rowDigests_[r] = h_.maxU64(h_.rank() == r ? digest_ : 0);
  }
  h_.barrier();
  return row;
}

}  // namespace

int commsNeeded(const Args& args) {
  return std::find(args.modes.begin(), args.modes.end(), Mode::PowerSgd) != args.modes.end() ? 2
                                                                                            : 1;
}

int runRank(Harness& h, const Args& args) {
  try {
    Bench b(h, args);
    return b.run();
  } catch (const std::exception& e) {
    h.fail(std::string("error: ") + e.what());
  }
  return 1;
}

}  // namespace perf
