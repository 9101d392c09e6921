#include "inputs.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtypes.h"
#include "safetensors.h"

namespace perf {

MatrixView batchedView(size_t count) {
  MatrixView v;
  if (count == 0) return v;
  size_t s = static_cast<size_t>(std::sqrt(static_cast<double>(count)));
  while (s * s > count) --s;
  while ((s + 1) * (s + 1) <= count) ++s;
  for (size_t n = s; n >= 1; --n) {
    if (count % n == 0) {
      const size_t m = count / n;
      if (m <= 4 * n) {
        v.rows = n;
        v.cols = m;
        v.padded = 0;
        return v;
      }
      break;  // the largest divisor <= sqrt fails the aspect test: smaller ones fail too
    }
  }
  const size_t side = (s * s == count) ? s : s + 1;
  v.rows = v.cols = side;
  v.padded = side * side - count;
  return v;
}

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A deterministic stream of numbers, uniform in [-1, 1).
class Stream {
 public:
  Stream(uint64_t seed, uint64_t a, uint64_t b)
      : key_(splitmix(splitmix(seed) ^ splitmix(a * 0x100000001b3ull + b))) {}
  double at(uint64_t i) const {
    return static_cast<double>(splitmix(key_ ^ (i * 0xd6e8feb86659fd93ull)) >> 11) * 0x1p-52 - 1.0;
  }

 private:
  uint64_t key_;
};

enum StreamId : uint64_t { kU = 1, kV, kC, kNoise, kProd, kInt };
constexpr uint64_t kShared = 0xffffffffull;  // "rank" of the streams shared by all ranks

// Small integers in {-1, 0, 1}: products and sums of a few of them are exact in every floating
// type, so each G_i (|entries| <= k^2) is exactly representable even in bfloat16 (k <= 16) and the
// sum over comm ranks is exactly of rank <= k after rounding to the dtype.
double trit(const Stream& s, uint64_t i) {
  const double x = s.at(i);
  return x < -1.0 / 3 ? -1.0 : (x < 1.0 / 3 ? 0.0 : 1.0);
}

void rankK(float* out, size_t count, int rank, const SyntheticSpec& s) {
  const size_t n = s.view.rows, m = s.view.cols;
  // The sum has rank k in the view, and no view has rank above min(n, m).
  const size_t k = std::min(static_cast<size_t>(std::max(1, s.k)), std::min(n, m));
  Stream su(s.seed, kShared, kU), sv(s.seed, kShared, kV), sc(s.seed, rank, kC);
  // W = C_i V^T (k x m)
  std::vector<double> c(k * k), w(k * m);
  for (size_t i = 0; i < k * k; ++i) c[i] = trit(sc, i);
  for (size_t col = 0; col < m; ++col)
    for (size_t a = 0; a < k; ++a) {
      double acc = 0;
      for (size_t b = 0; b < k; ++b) acc += c[a * k + b] * trit(sv, col * k + b);
      w[a * m + col] = acc;
    }
  std::vector<double> u(k);
  for (size_t r = 0; r < n; ++r) {
    const size_t begin = r * m;
    if (begin >= count) break;
    const bool partial = begin + m > count;  // the row reaches into the padding: zero
    for (size_t a = 0; a < k; ++a) u[a] = partial ? 0.0 : trit(su, r * k + a);
    const size_t end = std::min(count, begin + m);
    for (size_t e = begin; e < end; ++e) {
      const size_t col = e - begin;
      double acc = 0;
      for (size_t a = 0; a < k; ++a) acc += u[a] * w[a * m + col];
      out[e] = static_cast<float>(acc);
    }
  }
}

void decaying(float* out, size_t count, int rank, const SyntheticSpec& s) {
  const size_t n = s.view.rows, m = s.view.cols;
  constexpr int kTerms = 16;
  Stream su(s.seed, kShared, kU), sv(s.seed, kShared, kV), noise(s.seed, rank, kNoise);
  const double unit = std::sqrt(3.0);  // uniform(-1,1) * sqrt(3): unit variance
  std::vector<double> v(static_cast<size_t>(kTerms) * m);
  for (size_t i = 0; i < v.size(); ++i) v[i] = unit * sv.at(i);
  double a[kTerms];
  for (size_t r = 0; r < n; ++r) {
    const size_t begin = r * m;
    if (begin >= count) break;
    double decay = 1.0;
    for (int j = 0; j < kTerms; ++j, decay *= 0.7) a[j] = decay * unit * su.at(r * kTerms + j);
    const size_t end = std::min(count, begin + m);
    for (size_t e = begin; e < end; ++e) {
      const size_t col = e - begin;
      double acc = 0;
      for (int j = 0; j < kTerms; ++j) acc += a[j] * v[static_cast<size_t>(j) * m + col];
      out[e] = static_cast<float>(acc + 0.1 * unit * noise.at(e));
    }
  }
}

}  // namespace

void makeSynthetic(void* buf, size_t count, int rank, const SyntheticSpec& spec) {
  if (!isFloating(spec.type)) {
    Stream st(spec.seed, rank, kInt);
    const bool sgn = isSigned(spec.type);
    for (size_t i = 0; i < count; ++i) {
      const uint64_t h = static_cast<uint64_t>((st.at(i) + 1.0) * 1024.0);
      double v;
      if (spec.op == lowrankProd) {
        v = (rank == 0 && h % 7 == 0) ? 2.0 : 1.0;
        if (sgn && (h & 8)) v = -v;
      } else {
        v = sgn ? static_cast<double>(h % 5) - 2.0 : static_cast<double>(h % 4);
      }
      storeFromDouble(buf, spec.type, i, v);
    }
    return;
  }
  std::vector<float> f(count);
  if (spec.op == lowrankProd) {
    Stream st(spec.seed, rank, kProd);
    for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(1.0 + 0.25 * st.at(i));
  } else if (spec.exactRankK) {
    rankK(f.data(), count, rank, spec);
  } else {
    decaying(f.data(), count, rank, spec);
  }
  if (spec.type == lowrankFloat64) {
    // keep the float values (exactly representable); rank-k structure is kept up to float rounding
    for (size_t i = 0; i < count; ++i) static_cast<double*>(buf)[i] = f[i];
  } else {
    fromFloat(f.data(), count, spec.type, buf);
  }
}

Gradients loadGradients(const std::string& dir, std::string* step, int rank) {
  const auto files = findWorkerFiles(dir, step);
  Gradients g;
  g.file = files[static_cast<size_t>(rank) % files.size()];
  auto tensors = loadSafetensors(g.file);
  size_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  g.data.reserve(total);
  for (auto& t : tensors) {
    if (t.numel() == 0) continue;
    g.names.push_back(t.name);
    g.shapes.push_back(t.shape.empty() ? std::vector<size_t>{1} : t.shape);
    g.data.insert(g.data.end(), t.data.begin(), t.data.end());
  }
  if (g.data.empty()) throw SafetensorsError(g.file + ": all tensors are empty");
  return g;
}

uint64_t layoutHash(const Gradients& g) {
  uint64_t h = splitmix(g.shapes.size());
  for (const auto& s : g.shapes) {
    h = splitmix(h ^ s.size());
    for (size_t d : s) h = splitmix(h ^ d);
  }
  return h;
}

}  // namespace perf
