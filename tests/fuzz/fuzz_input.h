// Reading a fuzz input as a sequence of choices (every byte string is a valid input: a choice past
// the end reads zeros), and failing a fuzz target with a message. Shared by the targets of
// tests/fuzz, built with libFuzzer (clang) or with replay_main.cc (any compiler, CI).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace lowrank::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  bool empty() const { return p_ == end_; }
  size_t remaining() const { return size_t(end_ - p_); }

  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8 && p_ < end_; ++i) v |= uint64_t(*p_++) << (8 * i);
    return v;
  }
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  bool flag() { return byte() & 1; }
  // Uniform enough in [lo, hi] (hi - lo < 2^32).
  uint64_t range(uint64_t lo, uint64_t hi) {
    uint32_t v = 0;
    for (int i = 0; i < 4 && p_ < end_; ++i) v |= uint32_t(*p_++) << (8 * i);
    return lo + v % (hi - lo + 1);
  }
  // Up to maxLen bytes as a string, NUL bytes dropped (environment values cannot hold them).
  std::string text(size_t maxLen) {
    std::string s;
    for (size_t n = range(0, maxLen); n > 0 && p_ < end_; --n, ++p_)
      if (*p_) s.push_back(char(*p_));
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A broken invariant: says which, and aborts (libFuzzer saves the input; replay fails the test).
[[noreturn]] inline void fail(const char* target, const std::string& what) {
  std::fprintf(stderr, "fuzz %s: invariant broken: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace lowrank::fuzz

#define FUZZ_CHECK(target, cond, what)                 \
  do {                                                 \
    if (!(cond)) ::lowrank::fuzz::fail(target, (what)); \
  } while (0)
