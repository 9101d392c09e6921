// Random per-tensor layouts of a flat buffer, in the forms lowrankBufferSetLayout takes: weight
// matrices, conv kernels (out, in, kh, kw) and 1-D biases, as a model's gradient bucket packs them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace lowrank::soak {

using Shapes = std::vector<std::vector<size_t>>;

// A layout of exactly `total` elements, at most 8 tensors; the last one takes what is left (1-D).
inline Shapes randomLayout(size_t total, std::mt19937_64& rng) {
  Shapes out;
  size_t left = total;
  auto pick = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  while (left > 0 && out.size() < 7) {
    const size_t want =
        std::max<size_t>(1, size_t(double(left) * std::uniform_real_distribution<>(0.1, 1.0)(rng)));
    const int kind = int(pick(0, 3));
    if (kind == 0 || want < 4) {  // a bias or norm
      const size_t n = std::min(want, pick(1, 4096));
      out.push_back({n});
      left -= n;
      continue;
    }
    const size_t kernel = kind == 2 ? (pick(0, 1) ? 9 : 1) : 1;  // conv: 3x3 or 1x1
    const size_t inner = std::max<size_t>(1, want / kernel);
    // rows log-uniform in [1, inner]: tall, square and wide matrices all occur
    const size_t rows = std::max<size_t>(
        1, size_t(std::exp(std::uniform_real_distribution<>(0, std::log(double(inner)))(rng))));
    const size_t cols = std::max<size_t>(1, inner / rows);
    if (rows * cols * kernel > left) continue;
    if (kind == 2 && kernel == 9)
      out.push_back({rows, cols, 3, 3});
    else if (kind == 2)
      out.push_back({rows, cols, 1, 1});
    else
      out.push_back({rows, cols});
    left -= rows * cols * kernel;
  }
  if (left > 0) out.push_back({left});
  return out;
}

}  // namespace lowrank::soak
