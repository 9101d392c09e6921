#include "soak/soak.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>

#include "api/comm.h"
#include "lowrank/lowrank.h"
#include "soak/rank_work.h"
#include "soak/values.h"
#include "support/memory.h"
#include "support/ranks.h"
#include "util/dtype.h"

namespace lowrank::soak {
namespace {

using testing::residentBytes;
using testing::residentBytesTrimmed;

// Two communicator sets, so that both schedules and the warm-up run: set 0 pipelines (small
// chunks, so that buffers from 128 Ki elements cross chunk boundaries) at approximation rank 4;
// set 1 runs one phase after another at rank 2, after two exact warm-up calls per buffer.
constexpr const char* kPipelineChunk = "65536";
std::vector<lowrankConfig_t> commSets() {
  lowrankConfig_t a = testing::config(4), b = testing::config(2);
  a.pipeline = 1;
  b.pipeline = 0;
  b.startIter = 2;
  a.timeoutSec = b.timeoutSec = 600;  // a 16 M call of 4 ranks on 2 shared cores takes seconds
  return {a, b};
}

constexpr lowrankDataType_t kCompressible[] = {lowrankFloat32, lowrankFloat32, lowrankFloat16,
                                               lowrankBfloat16};
constexpr lowrankDataType_t kExactTypes[] = {lowrankInt8,   lowrankUint8, lowrankInt32,
                                             lowrankUint32, lowrankInt64, lowrankUint64,
                                             lowrankFloat64};
constexpr double kU32 = 0x1p-24;  // float32's unit roundoff: residuals and factors are float32
constexpr double kSafety = 4;     // tolerance over the worst-case rounding bound's estimate

std::vector<uint64_t> words(size_t bytes) {
  return std::vector<uint64_t>(std::max<size_t>(1, (bytes + 7) / 8));
}

class Soak {
 public:
  explicit Soak(const Options& o)
      : opt_(o),
        n_(o.ranks),
        rng_(o.seed),
        comms_(size_t(n_)),
        partials_(size_t(n_)),
        boundary_(n_, Boundary{this}),
        sync_(n_) {}

  Report run() {
    const char* old = std::getenv("LOWRANK_PIPELINE_CHUNK");
    const std::string saved = old ? old : "";
    setenv("LOWRANK_PIPELINE_CHUNK", kPipelineChunk, 1);
    if (!opt_.csv.empty()) {
      csv_ = std::fopen(opt_.csv.c_str(), "w");
      if (!csv_)
        fail("cannot write %s", opt_.csv.c_str());
      else
        std::fprintf(csv_, "call,rss_mb,rss_trimmed_mb,state_mb,live_buffers,live_elements\n");
    }
    t0_ = std::chrono::steady_clock::now();
    testing::withCommSets(n_, commSets(), [&](int r, const std::vector<lowrankComm_t>& comms) {
      comms_[size_t(r)] = comms;
      warmTransport(comms);         // counted: lowrank's call counters include these
      boundary_.arrive_and_wait();  // the first boundary takes the baseline and plans call 0
      while (!stop_) {
        runStep(r);
        boundary_.arrive_and_wait();
      }
    });
    if (old)
      setenv("LOWRANK_PIPELINE_CHUNK", saved.c_str(), 1);
    else
      unsetenv("LOWRANK_PIPELINE_CHUNK");
    if (csv_) std::fclose(csv_);
    report_.seconds = elapsed();
    return report_;
  }

 private:
  struct Boundary {
    Soak* s;
    void operator()() noexcept { s->boundary(); }
  };

  // ---- The rank threads ------------------------------------------------------------------------

  // Before the baseline, on every communicator: one exact allreduce of the largest size and one
  // compressed (pipelined on set 0) allreduce, its buffer then released. The transports' scratch,
  // UCX's buffer pools and the progress threads reach their working size once, and stay.
  static constexpr int kWarmUpCalls = 2;
  void warmTransport(const std::vector<lowrankComm_t>& comms) {
    std::vector<float> x(opt_.maxCount, 1.f), y(size_t(512) * 512, 1.f);
    for (lowrankComm_t c : comms) {
      if (lowrankAllReduce(x.data(), x.data(), x.size(), lowrankFloat32, lowrankMax, c, nullptr) !=
              lowrankSuccess ||
          lowrankAllReduce(y.data(), y.data(), y.size(), lowrankFloat32, lowrankSum, c, nullptr) !=
              lowrankSuccess ||
          lowrankBufferRelease(c, y.data()) != lowrankSuccess)
        warmFailed_ = true;
    }
  }

  void runStep(int r) {
    Step& s = step_;
    const size_t lo = s.count * size_t(r) / size_t(n_), hi = s.count * size_t(r + 1) / size_t(n_);
    Clock clock{r == 0};
    fillInput(s, r, n_);
    sync_.arrive_and_wait();
    reference(s, n_, lo, hi, partials_[size_t(r)]);
    sync_.arrive_and_wait();
    clock.lap(&report_.secondsReference);
    lowrankComm_t comm = stepComms_[size_t(r)];
    s.results[size_t(r)] = lowrankAllReduce(s.send[size_t(r)], s.recv[size_t(r)], s.count, s.dtype,
                                            s.op, comm, nullptr);
    if (s.results[size_t(r)] != lowrankSuccess) errors_[size_t(r)] = lowrankGetLastError(comm);
    sync_.arrive_and_wait();
    clock.lap(&report_.secondsAllReduce);
    for (lowrankResult_t res : s.results)
      if (res != lowrankSuccess) return;
    if (s.corrupt && r == 0) corruptResidual(s);  // element 0 is in rank 0's slice
    verify(s, stepComms_, lo, hi, partials_[size_t(r)]);
  }

  void corruptResidual(const Step& s) {
    const Buffer* b = stepComms_[0]->engine->find(s.recv[0]);
    auto* st = b ? dynamic_cast<HostState*>(b->rec ? b->rec->state.get() : nullptr) : nullptr;  // corrupted on purpose
    if (!st || st->error.empty()) return;
    st->error[0] += 0.01f * s.slot->scale;
    corrupted_ = true;
  }

  // Comm rank 0 times the phases of a step (each up to the barrier that ends it).
  struct Clock {
    bool on;
    std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
    void lap(double* into) {
      const auto now = std::chrono::steady_clock::now();
      if (on) *into += std::chrono::duration<double>(now - t).count();
      t = now;
    }
  };

  // ---- Between steps: one thread, the others wait at the barrier ------------------------------

  void boundary() {
    if (!started_) {
      started_ = true;
      if (warmFailed_) fail("the transport warm-up allreduce failed");
      report_.rssBaseline = residentBytesTrimmed();
      if (csv_)  // row 0: the baseline, before any buffer (the trimmed column holds it too)
        std::fprintf(csv_, "0,%.1f,%.1f,0.0,0,0\n", report_.rssBaseline / 1e6,
                     report_.rssBaseline / 1e6);
    } else {
      finishStep();
    }
    if (!report_.failures.empty() || index_ == opt_.calls) {
      drain(true);
      checkCounters();
      stop_ = true;
      return;
    }
    prepareStep();
  }

  void fail(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    report_.failures.push_back(std::string("call ") + std::to_string(index_) + ": " + buf);
  }

  double uniform01() { return std::uniform_real_distribution<>(0, 1)(rng_); }
  size_t below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  size_t logUniform(size_t hi) {  // in [1, hi], skewed to small: most calls are cheap
    const double x = std::exp(std::uniform_real_distribution<>(0, std::log(double(hi) + 1))(rng_));
    return std::clamp<size_t>(size_t(x), 1, hi);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  std::vector<lowrankComm_t> commsOf(int set) const {
    std::vector<lowrankComm_t> c;
    for (const auto& rank : comms_) c.push_back(rank[size_t(set)]);
    return c;
  }
  std::vector<void*> recvsOf(Slot& sl) const {
    std::vector<void*> v;
    for (int q = 0; q < n_; ++q) v.push_back(sl.recv(q));
    return v;
  }
  std::string describe(const Slot& sl) const {
    char buf[256];
    std::snprintf(
        buf, sizeof buf,
        "buffer %d (count %zu, %s, %s layout of %zu tensors, set %d, %zu calls since reset)", sl.id,
        sl.count, dtypeName(sl.dtype), sl.layout.empty() ? "batched" : "per-tensor",
        sl.layout.size(), sl.set, sl.calls);
    return buf;
  }

  // The invariant of a slot, from a merged Partial: |d - mean E| within the rounding its calls
  // may have left: per call, float32 on M = G + E and on E (scaled by the largest |E| seen), and
  // the dtype's rounding of the output and of an exact sum of N inputs.
  void judgeInvariant(Slot& sl, const Partial& m, const char* when) {
    ++report_.invariantChecks;
    sl.maxE = std::max(sl.maxE, m.maxE);
    const double tol = kSafety * (sl.sumTol + 3 * kU32 * double(sl.calls) * sl.maxE);
    if (m.wrong)
      fail("%s, %s: the engine holds a residual of another count", when, describe(sl).c_str());
    const double frac = m.maxErr == 0 ? 0 : m.maxErr / tol;
    if (std::isnan(frac) || frac > report_.worstTolFraction) report_.worstTolFraction = frac;
    if (sl.sumG > 0) report_.worstRelError = std::max(report_.worstRelError, m.maxErr / sl.sumG);
    if (!(m.maxErr <= tol))
      fail("%s, %s: error-feedback invariant off by %.3g (tolerance %.3g; sum of max|G| %.3g)",
           when, describe(sl).c_str(), m.maxErr, tol, sl.sumG);
  }
  void checkBeforeReset(Slot& sl, const char* why) {
    if (sl.calls == 0) return;
    Partial p;
    checkInvariant(sl, recvsOf(sl), commsOf(sl.set), 0, sl.count, p);
    judgeInvariant(sl, p, why);
  }

  void setLayout(Slot& sl) {
    std::vector<int> nd;
    std::vector<const size_t*> shapes;
    for (const auto& s : sl.layout) {
      nd.push_back(int(s.size()));
      shapes.push_back(s.data());
    }
    for (int q = 0; q < n_; ++q)
      if (lowrankBufferSetLayout(comms_[size_t(q)][size_t(sl.set)], sl.recv(q), int(nd.size()),
                                 nd.data(), shapes.data()) != lowrankSuccess)
        fail("lowrankBufferSetLayout of %s refused", describe(sl).c_str());
  }

  double liveEstimate() const {  // residuals of every rank: what dominates the state
    double b = 0;
    for (const auto& sl : slots_) b += double(n_) * 4.0 * double(sl->count);
    return b;
  }

  void makeSlot() {
    const size_t count = logUniform(opt_.maxCount);
    while (!slots_.empty() && liveEstimate() + double(n_) * 4.0 * double(count) > opt_.capBytes)
      releaseSlot(below(slots_.size()));
    auto sl = std::make_unique<Slot>();
    sl->id = int(report_.buffersMade++);
    sl->set = int(below(2));
    sl->capacityBytes = count * 4;  // room for float32, whatever dtype it starts with
    for (int q = 0; q < n_; ++q) sl->mem.push_back(words(sl->capacityBytes));
    sl->dtype = kCompressible[below(4)];
    sl->count = count;
    sl->signal = rng_();
    sl->scale =
        float(std::exp(std::uniform_real_distribution<>(std::log(1e-2), std::log(1e2))(rng_)));
    if (count >= 2 && uniform01() < 0.35) {
      sl->layout = randomLayout(count, rng_);
      setLayout(*sl);
    }
    sl->resetModel();
    report_.largestCount = std::max(report_.largestCount, count);
    slots_.push_back(std::move(sl));
  }

  void releaseSlot(size_t i) {
    Slot& sl = *slots_[i];
    checkBeforeReset(sl, "before release");
    for (int q = 0; q < n_; ++q)
      lowrankBufferRelease(comms_[size_t(q)][size_t(sl.set)], sl.recv(q));
    slots_.erase(slots_.begin() + std::ptrdiff_t(i));
    ++report_.releases;
  }

  void resetSlot(Slot& sl) {
    checkBeforeReset(sl, "before reset");
    for (int q = 0; q < n_; ++q) lowrankBufferReset(comms_[size_t(q)][size_t(sl.set)], sl.recv(q));
    sl.resetModel();
    ++report_.resets;
  }

  void relayout(Slot& sl) {  // a new layout of the same count: the state restarts (lowrank.h)
    if (sl.count < 2) return;
    checkBeforeReset(sl, "before a layout change");
    sl.layout = randomLayout(sl.count, rng_);
    setLayout(sl);
    sl.resetModel();
    ++report_.layoutChanges;
  }

  // Another count or dtype in the same memory: the next compressed call resets the state.
  void reshape(Slot& sl) {
    checkBeforeReset(sl, "before a count or dtype change");
    const size_t oldCount = sl.count;
    const lowrankDataType_t oldType = sl.dtype;
    for (int tries = 0; tries < 16 && sl.count == oldCount && sl.dtype == oldType; ++tries) {
      sl.dtype = kCompressible[below(4)];
      sl.count = logUniform(sl.capacityBytes / dtypeSize(sl.dtype));
    }
    if (!sl.layout.empty()) {
      sl.layout = sl.count >= 2 ? randomLayout(sl.count, rng_) : Shapes{{1}};
      setLayout(sl);
    }
    sl.resetModel();
    ++report_.reshapes;
  }

  // Every buffer released: the engine must hold no state, and memory must be back to baseline.
  void drain(bool end) {
    while (!slots_.empty()) releaseSlot(slots_.size() - 1);
    const size_t raw = residentBytes(), trimmed = residentBytesTrimmed();
    uint64_t state = 0, buffers = 0;
    totals(&state, &buffers);
    ++report_.drains;
    drainRss_ = trimmed;
    report_.rssWorstDrain = std::max(report_.rssWorstDrain, trimmed);
    if (state != 0 || buffers != 0)
      fail("every buffer released, yet the engine holds %llu bytes of state in %llu buffers",
           (unsigned long long)state, (unsigned long long)buffers);
    if (trimmed > report_.rssBaseline + opt_.rssMarginBytes)
      fail(
          "every buffer released, yet resident memory is %.1f MB, baseline %.1f MB + margin %.1f "
          "MB",
          trimmed / 1e6, report_.rssBaseline / 1e6, opt_.rssMarginBytes / 1e6);
    if (end) {
      report_.rssEnd = trimmed;
      report_.rssEndUntrimmed = raw;
      report_.stateEnd = state;
      report_.buffersEnd = buffers;
    }
  }

  void totals(uint64_t* state, uint64_t* buffers) {
    for (const auto& rank : comms_)
      for (lowrankComm_t c : rank) {
        lowrankStats_t st;
        if (lowrankGetStats(c, &st) != lowrankSuccess) continue;
        *state += st.stateBytes;
        *buffers += st.buffers;
      }
  }

  // lowrank's counters on every rank agree with the calls made.
  void checkCounters() {
    for (int q = 0; q < n_; ++q) {
      uint64_t calls = 0, fallbacks = 0;
      for (lowrankComm_t c : comms_[size_t(q)]) {
        lowrankStats_t st;
        if (lowrankGetStats(c, &st) != lowrankSuccess) continue;
        calls += st.calls;
        fallbacks += st.fallbackCalls;
      }
      if (calls != report_.calls + kWarmUpCalls * comms_[size_t(q)].size() || fallbacks != report_.fallbacks)
        fail(
            "comm rank %d counts %llu calls and %llu fallbacks; the soak made %zu (and one warm-up "
            "per communicator) and saw %zu",
            q, (unsigned long long)calls, (unsigned long long)fallbacks, report_.calls,
            report_.fallbacks);
    }
  }

  void sideActions() {
    if (index_ > 0 && (index_ == opt_.calls / 2 || uniform01() < 0.001)) drain(false);
    if (slots_.empty() || (slots_.size() < 12 && uniform01() < 0.12)) makeSlot();
    const double u = uniform01();
    if (u < 0.015)
      resetSlot(*slots_[below(slots_.size())]);
    else if (u < 0.035)
      releaseSlot(below(slots_.size()));
    else if (u < 0.05)
      relayout(*slots_[below(slots_.size())]);
    else if (u < 0.065)
      reshape(*slots_[below(slots_.size())]);
    if (slots_.empty()) makeSlot();
  }

  void prepareStep() {
    drainRss_ = 0;
    sideActions();
    step_ = Step{};
    Step& s = step_;
    s.index = index_;
    s.inputs = rng_();
    s.inPlace = uniform01() < 0.5;
    s.check = uniform01() < opt_.checkProb;
    const double u = uniform01();
    Slot& sl = *slots_[below(slots_.size())];
    if (u < 0.85) {
      s.slot = &sl;
      s.set = sl.set;
    } else {
      s.set = int(below(2));
    }
    if (u < 0.70) {
      s.kind = uniform01() < 0.01 ? CallKind::kFallback : CallKind::kCompressed;
      s.count = sl.count;
      s.dtype = sl.dtype;
      // float32 only: the 16-bit dtypes' tolerance includes their output rounding (not fed back
      // into E), summed over the calls since the reset, which can exceed 1% of the input scale.
      if (index_ >= opt_.corruptResidualFrom && !corrupted_ && s.kind == CallKind::kCompressed &&
          s.dtype == lowrankFloat32)
        s.corrupt = s.check = true;
      s.op = uniform01() < 0.5 ? lowrankSum : lowrankAvg;
      if (s.kind == CallKind::kFallback) {
        checkBeforeReset(sl, "before a non-finite input");
        sl.resetModel();
        s.check = true;
        s.nanRank = int(below(size_t(n_)));
        s.nanIndex = below(s.count);
        lowrankStats_t st;
        lowrankGetStats(comms_[0][size_t(s.set)], &st);
        fallbacksBefore_ = st.fallbackCalls;
      }
    } else {
      // An exact op: prod, max or min of a compressible dtype, or any op of another dtype.
      const bool compressibleType = uniform01() < 0.5;
      s.dtype = compressibleType ? kCompressible[below(4)] : kExactTypes[below(7)];
      s.op = compressibleType ? lowrankRedOp_t(lowrankProd + below(3)) : lowrankRedOp_t(below(5));
      if (s.slot) {
        s.kind = CallKind::kExactSlot;
        s.count = std::max<size_t>(1, sl.bytes() / dtypeSize(s.dtype));
      } else {
        s.kind = CallKind::kExactTemp;
        s.count = logUniform(std::min<size_t>(opt_.maxCount, size_t(1) << 20));
      }
    }
    const size_t bytes = s.count * dtypeSize(s.dtype);
    for (int q = 0; q < n_; ++q) {
      if (s.kind == CallKind::kExactTemp) s.tempMem.emplace_back(bytes);
      s.recv.push_back(s.slot ? sl.recv(q) : s.tempMem.back().data());
      if (!s.inPlace) s.sendMem.emplace_back(bytes);
      s.send.push_back(s.inPlace ? s.recv.back() : s.sendMem.back().data());
    }
    if (s.check && (s.kind == CallKind::kExactSlot || s.kind == CallKind::kExactTemp))
      s.expected.emplace(bytes);
    s.results.assign(size_t(n_), lowrankSuccess);
    errors_.assign(size_t(n_), "");
    partials_.assign(size_t(n_), Partial{});
    stepComms_ = commsOf(s.set);
  }

  void finishStep() {
    Step& s = step_;
    Partial m;
    for (const Partial& p : partials_) {
      m.maxG = std::max(m.maxG, p.maxG);
      m.maxOut = std::max(m.maxOut, p.maxOut);
      m.maxE = std::max(m.maxE, p.maxE);
      m.maxErr = std::isnan(m.maxErr) || std::isnan(p.maxErr) ? NAN : std::max(m.maxErr, p.maxErr);
      m.differ += p.differ;
      m.wrong += p.wrong;
    }
    bool ok = true;
    for (int q = 0; q < n_; ++q)
      if (s.results[size_t(q)] != lowrankSuccess) {
        ok = false;
        fail("comm rank %d: lowrankAllReduce (count %zu, %s, %s) returned %s: %s", q, s.count,
             dtypeName(s.dtype), opName(s.op), lowrankGetErrorString(s.results[size_t(q)]),
             errors_[size_t(q)].c_str());
      }
    if (ok) {
      if (m.differ)
        fail("%zu elements of the output differ between comm ranks (count %zu, %s, %s)", m.differ,
             s.count, dtypeName(s.dtype), opName(s.op));
      const double ud = unitRoundoff(s.dtype), nr = double(n_);
      switch (s.kind) {
        case CallKind::kCompressed: {
          Slot& sl = *s.slot;
          ++report_.compressed;
          ++sl.calls;
          sl.sumG += m.maxG;
          sl.sumTol += kU32 * nr * m.maxG + ud * (m.maxOut + nr * m.maxG);
          if (s.check) judgeInvariant(sl, m, "after the call");
          break;
        }
        case CallKind::kFallback: {
          Slot& sl = *s.slot;
          ++report_.nonFinite;
          ++report_.nonFiniteChecks;
          const double tol = kSafety * (kU32 * nr * m.maxG + ud * (m.maxOut + nr * m.maxG));
          if (m.wrong || !(m.maxErr <= tol))
            fail(
                "non-finite input on comm rank %d, %s: the exact allreduce is off by %.3g "
                "(tolerance %.3g), NaN lost at %zu elements",
                s.nanRank, describe(sl).c_str(), m.maxErr, tol, m.wrong);
          // Compressed plans fall back (state reset, counted); warm-up and all-exact plans are
          // exact calls anyway, state kept.
          lowrankStats_t st;
          lowrankBufferView_t v;
          lowrankGetStats(comms_[0][size_t(s.set)], &st);
          lowrankBufferGetView(comms_[0][size_t(s.set)], sl.recv(0), &v);
          const bool fellBack = st.fallbackCalls == fallbacksBefore_ + 1;
          report_.fallbacks += fellBack;
          if (fellBack == bool(v.planned))
            fail("non-finite input, %s: fallback counted %d, but the buffer is %s",
                 describe(sl).c_str(), int(fellBack), v.planned ? "still planned" : "reset");
          sl.resetModel();
          break;
        }
        case CallKind::kExactSlot:
        case CallKind::kExactTemp:
          ++(s.kind == CallKind::kExactSlot ? report_.exactOnSlot : report_.exactTemp);
          if (s.check) {
            ++report_.exactChecks;
            if (m.wrong)
              fail(
                  "exact allreduce (count %zu, %s, %s, %s): %zu elements differ from the reference",
                  s.count, dtypeName(s.dtype), opName(s.op),
                  s.inPlace ? "in place" : "out of place", m.wrong);
          }
          break;
      }
    }
    ++index_;
    ++report_.calls;
    record();
    step_ = Step{};  // frees this call's inputs and temporary buffers
  }

  void record() {
    uint64_t state = 0, buffers = 0;
    totals(&state, &buffers);
    const size_t rss = residentBytes();
    report_.rssPeak = std::max(report_.rssPeak, rss);
    report_.statePeak = std::max(report_.statePeak, state);
    size_t elements = 0;
    for (const auto& sl : slots_) elements += sl->count;
    if (csv_) {
      std::fprintf(csv_, "%zu,%.1f,", index_, rss / 1e6);
      if (drainRss_) std::fprintf(csv_, "%.1f", drainRss_ / 1e6);
      std::fprintf(csv_, ",%.1f,%zu,%zu\n", state / 1e6, slots_.size(), elements);
    }
    if (opt_.progress && index_ % 500 == 0)
      std::fprintf(stderr, "soak: call %zu/%zu, %.0f s: RSS %.0f MB, state %.0f MB, %zu buffers\n",
                   index_, opt_.calls, elapsed(), rss / 1e6, state / 1e6, slots_.size());
  }

  const Options opt_;
  const int n_;
  std::mt19937_64 rng_;
  std::vector<std::vector<lowrankComm_t>> comms_;  // [comm rank][set]
  std::vector<std::unique_ptr<Slot>> slots_;
  Step step_;
  std::vector<lowrankComm_t> stepComms_;  // [comm rank]: the set of this step
  std::vector<Partial> partials_;
  std::vector<std::string> errors_;
  std::barrier<Boundary> boundary_;
  std::barrier<> sync_;
  bool started_ = false, stop_ = false;
  std::atomic<bool> warmFailed_{false};
  bool corrupted_ = false;
  size_t index_ = 0, drainRss_ = 0;
  uint64_t fallbacksBefore_ = 0;
  FILE* csv_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  Report report_;
};

}  // namespace

Report runSoak(const Options& opt) { return Soak(opt).run(); }

}  // namespace lowrank::soak
