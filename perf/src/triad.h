// A STREAM-style triad (a = b + s * c, float32, one thread) for the bandwidth bound of each row.
#pragma once

#include <cstddef>
#include <functional>

namespace perf {

// Arrays of `mib` MiB each (three of them), allocated and first-touched before timing.
class Triad {
 public:
  explicit Triad(size_t mib);
  ~Triad();
  Triad(const Triad&) = delete;
  Triad& operator=(const Triad&) = delete;
  bool ok() const { return a_ && b_ && c_; }
  // One pass over the arrays; returns its seconds.
  double once();
  // Bytes one pass moves, counted as STREAM does (read b, read c, write a; no write-allocate).
  double bytesPerPass() const { return 12.0 * static_cast<double>(n_); }

 private:
  size_t n_;
  float *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
};

}  // namespace perf
