// Deterministic test inputs: rank-k sums and decaying spectra, per comm rank.
#pragma once
#include <cmath>
#include <random>
#include <vector>

namespace lowrank::testing {

inline std::vector<float> gaussian(size_t count, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

// G_i = U C_i V^T (n x m row-major) with U, V shared by all ranks: the sum over ranks has rank k.
inline std::vector<float> rankKInput(size_t n, size_t m, int k, int rank, unsigned seed = 1) {
  std::vector<float> u = gaussian(n * k, seed), v = gaussian(m * k, seed + 1),
                     c = gaussian(size_t(k) * k, seed + 100 + rank);
  std::vector<float> g(n * m, 0.f);
  for (size_t i = 0; i < n; ++i)
    for (int a = 0; a < k; ++a)
      for (int b = 0; b < k; ++b) {
        const float w = u[i * k + a] * c[a * k + b];
        for (size_t j = 0; j < m; ++j) g[i * m + j] += w * v[j * k + b];
      }
  return g;
}

// A decaying spectrum shared by all ranks plus per-rank noise: what gradients look like.
inline std::vector<float> decayingInput(size_t n, size_t m, int rank, unsigned seed = 7) {
  std::vector<float> g = gaussian(n * m, seed + 1000 + rank, 0.05f);
  for (int j = 0; j < 12; ++j) {
    std::vector<float> u = gaussian(n, seed + 2 * j), v = gaussian(m, seed + 2 * j + 1);
    const float s = std::pow(0.6f, float(j));
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < m; ++b) g[a * m + b] += s * u[a] * v[b];
  }
  return g;
}

inline double norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace lowrank::testing
