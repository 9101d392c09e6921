// The emulated device's queues and the order in which their work runs (runtime.h).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "runtime.h"
#include "sync_calls.h"
#include "trace.h"

namespace emu {
namespace {

bool tracing = false;
std::vector<TracedOp> traced;  // under deviceMutex

uint64_t nextSeq = 1;
bool running = false;  // an operation is running: it must not force the device

// LOWRANK_EMU_SEED: 0 (default) runs the ready operation issued last; another value picks at random.
uint64_t seed() {
  static const uint64_t value = [] {
    const char* env = std::getenv("LOWRANK_EMU_SEED");
    if (!env || !*env) return uint64_t(0);
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (*end || *env == '-') fail("LOWRANK_EMU_SEED=%s: not a non-negative integer", env);
    return uint64_t(v);
  }();
  return value;
}

// LOWRANK_EMU_UNBOUNDED_WAIT_S: how long a synchronous call may wait on a gate before the emulation
// names the unbounded wait (default 30 s; run_mutants.sh sets less, where only the failure counts).
int unboundedWaitSec() {
  static const int value = [] {
    const char* env = std::getenv("LOWRANK_EMU_UNBOUNDED_WAIT_S");
    if (!env || !*env) return 30;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end || v < 1 || v > 3600) fail("LOWRANK_EMU_UNBOUNDED_WAIT_S=%s: not seconds in [1, 3600]", env);
    return int(v);
  }();
  return value;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(seed());
  return r;
}

// Marks target and everything it depends on (not yet run) as needed.
void need(const OpPtr& target) {
  std::vector<Op*> todo{target.get()};
  while (!todo.empty()) {
    Op* op = todo.back();
    todo.pop_back();
    if (op->done || op->needed) continue;
    op->needed = true;
    if (op->prev) todo.push_back(op->prev.get());
    for (const OpPtr& a : op->after) todo.push_back(a.get());
  }
}

bool gated(const Op& op) { return op.gate && !op.gate(); }

bool ready(const Op& op) {
  if (!op.needed || gated(op)) return false;
  for (const OpPtr& a : op.after)
    if (!a->done) return false;
  return true;  // its stream's earlier work has run: it is the head of the queue
}

// Runs one needed operation whose dependencies have all run; false when only closed gates
// (enqueueGatedHostWork) hold back what is needed.
bool runOne(const OpPtr& target) {
  std::vector<CUstream_st*> heads;
  bool held = false;
  for (CUstream_st* s : streams()) {
    if (s->queue.empty()) continue;
    const Op& head = *s->queue.front();
    if (ready(head)) heads.push_back(s);
    held = held || (head.needed && gated(head));
  }
  if (heads.empty() && held) return false;
  if (heads.empty())
    fail("nothing can run before '%s' (a dependency cycle in the emulation)", target->what.c_str());
  std::sort(heads.begin(), heads.end(), [](CUstream_st* a, CUstream_st* b) {
    return a->queue.front()->seq < b->queue.front()->seq;
  });
  CUstream_st* s = seed() == 0 ? heads.back() : heads[rng()() % heads.size()];
  OpPtr op = s->queue.front();
  s->queue.pop_front();
  if (op->run) {
    running = true;
    op->run();
    running = false;
  }
  op->done = true;
  op->doneAt = std::chrono::steady_clock::now();
  op->prev.reset();
  op->after.clear();
  return true;
}

}  // namespace

void fail(const char* fmt, ...) {
  std::fprintf(stderr, "CUDA emulation: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::abort();
}

std::recursive_mutex& deviceMutex() {
  static std::recursive_mutex m;
  return m;
}

std::vector<CUstream_st*>& streams() {
  static std::vector<CUstream_st*>* all = [] {
    auto* v = new std::vector<CUstream_st*>;  // never destroyed: used until exit
    auto* legacy = new CUstream_st;
    legacy->legacy = true;
    v->push_back(legacy);
    return v;
  }();
  return *all;
}

CUstream_st* stream(cudaStream_t s) { return s ? s : streams().front(); }

cudaError_t enqueue(cudaStream_t handle, std::string what, std::function<void()> run,
                    const OpPtr& waitFor, OpPtr* out) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (out) out->reset();
  CUstream_st* s = stream(handle);
  if (s->capture != cudaStreamCaptureStatusNone) return captureAppend(s, std::move(what), std::move(run));
  if (s->legacy) {
    countSync("legacy stream");
    if (cudaError_t e = checkUnsafeDuringCapture(true)) return e;
  }
  auto op = std::make_shared<Op>();
  op->seq = nextSeq++;
  if (tracing) {
    TracedOp t;
    t.seq = op->seq;
    t.stream = s;
    t.what = what;
    if (s->tail) t.deps.push_back(t.streamDep = s->tail->seq);
    if (waitFor) t.deps.push_back(t.eventDep = waitFor->seq);
    for (CUstream_st* other : streams())
      if (other != s && other->tail && ((s->legacy && other->blocking) || (other->legacy && s->blocking)))
        t.deps.push_back(other->tail->seq);
    traced.push_back(std::move(t));
  }
  op->what = std::move(what);
  op->run = std::move(run);
  if (s->tail && !s->tail->done) op->prev = s->tail;
  if (waitFor && !waitFor->done) op->after.push_back(waitFor);
  // The legacy default stream waits for every blocking stream, and they wait for it.
  for (CUstream_st* other : streams()) {
    if (other == s || !other->tail || other->tail->done) continue;
    if ((s->legacy && other->blocking) || (other->legacy && s->blocking)) op->after.push_back(other->tail);
  }
  s->queue.push_back(op);
  s->tail = op;
  if (out) *out = op;
  return cudaSuccess;
}

void complete(const OpPtr& target) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (!target || target->done) return;
  if (running) fail("queued work ('%s' pending) was forced from inside queued work", target->what.c_str());
  need(target);
  const auto start = std::chrono::steady_clock::now();
  while (!target->done)
    if (!runOne(target)) {  // a gate holds it: wait, as CUDA would, for whoever opens it
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(unboundedWaitSec()))
        fail("'%s' waited %d s for work held by a gate (an unbounded host wait on a stalled "
             "stream)", target->what.c_str(), unboundedWaitSec());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

bool poll(const OpPtr& target) {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  if (!target || target->done) return true;
  need(target);
  runOne(target);
  return target->done;
}

cudaError_t syncLegacy() {
  OpPtr marker;
  if (cudaError_t e = enqueue(nullptr, "synchronous call", {}, nullptr, &marker)) return e;
  complete(marker);
  return cudaSuccess;
}

void traceBegin() {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  traced.clear();
  tracing = true;
}

std::vector<TracedOp> traceEnd() {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  tracing = false;
  return std::move(traced);
}

void syncDevice() {
  std::lock_guard<std::recursive_mutex> lock(deviceMutex());
  for (CUstream_st* s : streams()) complete(s->tail);
}

}  // namespace emu
