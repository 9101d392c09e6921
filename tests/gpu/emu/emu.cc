// The fiber scheduler of the CUDA emulation (emu.h): a CUDA block's threads run as fibers on
// one OS thread, switched only at barriers, in thread order.
#include "emu.h"

#include <cstdio>
#include <cstdlib>

// AddressSanitizer must be told of every stack switch (it tracks the current stack's bounds, and
// its fake stacks per context); each switch below is wrapped in start/finish annotations.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulation's context switch is written for x86-64"
#endif

// emu_switch(from, to): saves the callee-saved registers on the current stack, stores the stack
// pointer in *from, and resumes the fiber whose stack pointer is `to`.
extern "C" void emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace emu {
namespace {

constexpr size_t kStack = 256 * 1024;
enum { kNone = 0, kBlock = 1, kWarp = 2 };

// The scheduler's stack, as ASan tells each fiber when it starts (for the switches back).
const void* schedStackBottom = nullptr;
size_t schedStackSize = 0;

// switchTo(from, to, bottom, size): emu_switch to the context `to` whose stack is [bottom,
// bottom + size), annotated for ASan; returns when something switches back. `dying`: the current
// fiber never resumes (ASan frees its fake stack).
void switchTo(void** from, void* to, const void* bottom, size_t size, bool dying = false) {
#if EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, bottom, size);
  emu_switch(from, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)bottom, (void)size, (void)dying;
  emu_switch(from, to);
#endif
}

[[noreturn]] void fail(const char* what) {
  State& s = state();
  std::fprintf(stderr, "CUDA emulation: %s (block %u, thread %u)\n", what, s.bIdx.x, s.cur);
  std::abort();
}

// First code of every fiber: runs the kernel body, then returns to the scheduler for good.
[[noreturn]] void trampoline() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &schedStackBottom, &schedStackSize);
#endif
  State& s = state();
  (*s.body)();
  Fiber& f = s.fibers[s.cur];
  f.done = true;
  switchTo(&f.sp, s.schedSp, schedStackBottom, schedStackSize, /*dying=*/true);
  fail("a finished fiber was resumed");
}

// A fresh stack whose first switch "returns" into trampoline with the ABI's alignment.
void* freshStack(Fiber& f) {
  if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStack));
  if (!f.stack) fail("out of memory for fiber stacks");
#if EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(f.stack, kStack);  // frames of the last run that never returned
#endif
  uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kStack) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                               // trampoline's (unused) return address
  *--sp = reinterpret_cast<void*>(&trampoline);  // where emu_switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = nullptr;   // rbp rbx r12 r13 r14 r15
  return sp;
}

void park(int kind, uint64_t gen) {
  State& s = state();
  Fiber& f = s.fibers[s.cur];
  f.wait = kind;
  f.gen = gen;
  switchTo(&f.sp, s.schedSp, schedStackBottom, schedStackSize);
}

}  // namespace

void syncBlock() {
  State& s = state();
  const uint64_t gen = s.blockGen;
  if (++s.blockArrived == s.bDim.x) {
    s.blockArrived = 0;
    ++s.blockGen;
    return;
  }
  park(kBlock, gen);
}

void syncWarp() {
  State& s = state();
  const unsigned w = s.cur / 32;
  const unsigned lanes = s.bDim.x - 32 * w < 32 ? s.bDim.x - 32 * w : 32;
  const uint64_t gen = s.warpGen[w];
  if (++s.warpArrived[w] == lanes) {
    s.warpArrived[w] = 0;
    ++s.warpGen[w];
    return;
  }
  park(kWarp, gen);
}

cudaError_t launch(unsigned grid, unsigned block, const std::function<void()>& body) {
  State& s = state();
  if (block == 0 || block > 1024 || grid == 0 || grid > 0x7fffffffu)
    return cudaErrorInvalidConfiguration;
  if (s.fibers.size() < block) s.fibers.resize(block);
  const unsigned warps = (block + 31) / 32;
  s.body = &body;
  s.gDim = {grid, 1, 1};
  s.bDim = {block, 1, 1};
  s.slots.assign(block, 0);
  for (unsigned b = 0; b < grid; ++b) {
    s.bIdx = {b, 0, 0};
    s.blockArrived = 0;
    s.blockGen = 0;
    s.warpArrived.assign(warps, 0);
    s.warpGen.assign(warps, 0);
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = s.fibers[t];
      f.sp = freshStack(f);
      f.wait = kNone;
      f.done = false;
    }
    unsigned running = block;
    while (running) {
      bool progress = false;
      for (unsigned t = 0; t < block; ++t) {
        Fiber& f = s.fibers[t];
        if (f.done) continue;
        if (f.wait == kBlock && s.blockGen == f.gen) continue;
        if (f.wait == kWarp && s.warpGen[t / 32] == f.gen) continue;
        f.wait = kNone;
        s.cur = t;
        s.tIdx = {t, 0, 0};
        switchTo(&s.schedSp, f.sp, f.stack, kStack);
        progress = true;
        if (f.done) --running;
      }
      if (!progress) fail("deadlock: a barrier or warp shuffle that not every thread reached");
    }
  }
  return cudaSuccess;
}

}  // namespace emu
