#include "triad.h"

#include <chrono>
#include <cstdlib>

namespace perf {

namespace {
float* alloc(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return static_cast<float*>(std::aligned_alloc(64, bytes));
}
}  // namespace

Triad::Triad(size_t mib) : n_(mib * 1024 * 1024 / sizeof(float)) {
  a_ = alloc(n_);
  b_ = alloc(n_);
  c_ = alloc(n_);
  if (!ok()) return;
  for (size_t i = 0; i < n_; ++i) {  // first touch: page faults stay out of the timing
    a_[i] = 0.f;
    b_[i] = 1.f + static_cast<float>(i & 7);
    c_[i] = 0.5f * static_cast<float>(i & 3);
  }
}

Triad::~Triad() {
  std::free(a_);
  std::free(b_);
  std::free(c_);
}

double Triad::once() {
  float* __restrict pa = a_;
  const float* __restrict pb = b_;
  const float* __restrict pc = c_;
  const size_t n = n_;
  const auto t0 = std::chrono::steady_clock::now();
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.f * pc[i];
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // keep the stores: a value of the result escapes
  volatile float sink = pa[n / 2];
  (void)sink;
  return s;
}

}  // namespace perf
