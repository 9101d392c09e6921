// Deterministic N(0, 1) draws for the initial Q: the same (seed, stream) gives the same numbers on
// every comm rank and every machine (splitmix64 + Box-Muller, no libc randomness).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace lowrank::host {

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills x[0..count) with standard normal floats from the stream (seed, stream).
inline void fillNormal(float* x, size_t count, uint64_t seed, uint64_t stream) {
  uint64_t s = seed * 0x2545f4914f6cdd1dull ^ (stream + 0x632be59bd9b4e019ull);
  for (size_t i = 0; i < count; i += 2) {
    double u1 = (double((splitmix64(s) >> 11) + 1)) * 0x1.0p-53;  // (0, 1]
    double u2 = double(splitmix64(s) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1)), t = 6.283185307179586 * u2;
    x[i] = float(r * std::cos(t));
    if (i + 1 < count) x[i + 1] = float(r * std::sin(t));
  }
}

}  // namespace lowrank::host
