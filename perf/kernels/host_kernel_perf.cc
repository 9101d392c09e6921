// lowrank_kernel_perf: effective memory bandwidth of the three fused host passes of PowerSGD,
// beside a STREAM-style triad measured in the same run (single thread, best of R repeats).
// Bytes counted as STREAM does (no write-allocate): pass 1 reads G and E and writes E (12 B per
// float32 element), pass 2 reads M (4 B), pass 3 reads M, writes E and the output (12 B).
//
// usage: lowrank_kernel_perf [-m MiB per matrix (default 64)] [-k list (default 1,2,4,8)]
//                            [-r repeats (default 5)] [-s ROWSxCOLS (default: the batched
//                            view of -m MiB)]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "kernels/host/orthonormalize.h"
#include "kernels/host/powersgd_kernels.h"
#include "kernels/host/random.h"

using Clock = std::chrono::steady_clock;
using namespace lowrank;

template <typename F>
double bestSeconds(int repeats, F f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// A positive decimal count, all of s (no sign, no trailing text), at most `most`; 0 if not.
size_t positive(const std::string& s, size_t most) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) return 0;
  const size_t x = std::strtoull(s.c_str(), nullptr, 10);
  return x <= most ? x : 0;
}

int main(int argc, char** argv) {
  size_t mib = 64;
  int repeats = 5;
  std::vector<int> ks = {1, 2, 4, 8};
  size_t rows = 0, cols = 0;
  for (int c; (c = getopt(argc, argv, "m:k:r:s:h")) != -1;) {
    if (c == 'm') mib = std::strtoul(optarg, nullptr, 10);
    else if (c == 's') {  // at most 2^30 elements (4 GiB a matrix; the run holds six)
      const std::string a = optarg;
      const size_t x = a.find('x');
      rows = x == std::string::npos ? 0 : positive(a.substr(0, x), size_t(1) << 30);
      cols = rows ? positive(a.substr(x + 1), (size_t(1) << 30) / rows) : 0;
      if (!rows || !cols) {
        fprintf(stderr, "%s: -s takes ROWSxCOLS, two positive integers with at most 2^30 "
                "elements in all, e.g. 512x4608; got '%s'\n", argv[0], optarg);
        return 2;
      }
    }
    else if (c == 'r') repeats = std::atoi(optarg);
    else if (c == 'k') {
      ks.clear();
      std::stringstream ss(optarg);
      for (std::string t; std::getline(ss, t, ',');) ks.push_back(std::atoi(t.c_str()));
    } else {
      fprintf(c == 'h' ? stdout : stderr,
              "usage: %s [-m MiB] [-k 1,2,4,8] [-r repeats] [-s ROWSxCOLS (instead of -m)]\n",
              argv[0]);
      return c == 'h' ? 0 : 2;
    }
  }
  if (mib == 0 || repeats < 1 || ks.empty()) {
    fprintf(stderr, "%s: -m and -r must be positive, -k a list of ranks\n", argv[0]);
    return 2;
  }
  const size_t count = rows ? rows * cols : mib * 1024 * 1024 / sizeof(float);
  const host::MatrixView v = rows ? host::MatrixView{rows, cols, count, 0} : batchedView(count);
  for (int k : ks) {
    if (k < 1 || size_t(k) > std::min(v.rows, v.cols)) {  // orthonormalize needs k <= n, m
      fprintf(stderr, "%s: -k %d: each rank must be 1 .. min(rows, cols) = %zu for the %zu x %zu view\n",
              argv[0], k, std::min(v.rows, v.cols), v.rows, v.cols);
      return 2;
    }
  }
  std::vector<float> g(count), e(count, 0.f), out(count), a(count), b(count), c(count);
  host::fillNormal(g.data(), count, 1, 1);
  host::fillNormal(b.data(), count, 2, 2);
  host::fillNormal(c.data(), count, 3, 3);

  const double triad = bestSeconds(repeats, [&] {
    float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    const float* __restrict pc = c.data();
#pragma omp simd
    for (size_t i = 0; i < count; ++i) pa[i] = pb[i] + 3.f * pc[i];
  });
  const double triadBw = 12.0 * count / triad / 1e9;
  printf("# lowrank_kernel_perf: %.3g MiB float32 per matrix, view %zu x %zu, best of %d, 1 thread, "
         "element-wise passes %s (LOWRANK_HOST_ISA)\n",
         count * 4.0 / (1 << 20), v.rows, v.cols, repeats, host::hostIsaName(host::hostIsa()));
  printf("# triad a = b + s c: %.2f ms, %.2f GB/s (12 B per element)\n", triad * 1e3, triadBw);
  printf("#%4s %-24s %6s %10s %9s %9s\n", "k", "phase", "B/elem", "time(ms)", "GB/s", "of triad");
  for (int k : ks) {
    std::vector<float> qt(size_t(k) * v.cols), p(v.rows * size_t(k));
    host::fillNormal(qt.data(), qt.size(), 4, k);
    host::orthonormalize(qt.data(), v.cols, k, 1, v.cols, 0);
    std::fill(e.begin(), e.end(), 0.f);
    const double t1 = bestSeconds(repeats, [&] {
      host::errorFeedbackAndP(g.data(), lowrankFloat32, e.data(), v, qt.data(), k, p.data());
    });
    host::orthonormalize(p.data(), v.rows, k, k, 1, 0);
    const double t2 = bestSeconds(repeats, [&] {
      host::computeQ(g.data(), lowrankFloat32, e.data(), v, p.data(), k, qt.data());
    });
    const double t3 = bestSeconds(repeats, [&] {
      host::decompressAndUpdateError(e.data(), v, p.data(), qt.data(), k, 1.f, out.data(),
                                     lowrankFloat32);
    });
    const double orth = bestSeconds(repeats, [&] { host::orthonormalize(p.data(), v.rows, k, k, 1, 0); });
    struct { const char* name; double bytes, t; } rows[] = {
        {"pass1 ef-add + P=MQ", 12, t1}, {"pass2 Q=M^T P", 4, t2},
        {"pass3 decompress + E", 12, t3}, {"all three passes", 28, t1 + t2 + t3}};
    for (auto& r : rows) {
      const double bw = r.bytes * count / r.t / 1e9;
      printf(" %4d %-24s %6.0f %10.2f %9.2f %8.0f%%\n", k, r.name, r.bytes, r.t * 1e3, bw,
             100 * bw / triadBw);
    }
    printf(" %4d %-24s %6s %10.3f\n", k, "orthonormalize P", "-", orth * 1e3);
    // Alternating PowerSGD: the P step one pass by row tiles (12 B), the Q step two sweeps (the
    // factor with M written back, 12 B; the residual, E read and written, 8 B), then the
    // decompression without E (4 B written; its reads of the factors are L2-resident).
    const double tp = bestSeconds(repeats, [&] {
      host::alternateStepP(g.data(), lowrankFloat32, e.data(), v, qt.data(), k, p.data());
    });
    const double tq = bestSeconds(repeats, [&] {
      host::alternateStepQ(g.data(), lowrankFloat32, e.data(), v, p.data(), k, qt.data());
    });
    const double td = bestSeconds(repeats, [&] {
      host::decompressAndUpdateError(nullptr, v, p.data(), qt.data(), k, 1.f, out.data(),
                                     lowrankFloat32);
    });
    // The Q step's residual left to the next P step (HostState::residualPending): the Q step one
    // sweep (12 B), the P step its residual first, tile by tile, then as above (12 B). The kept P
    // is put back before each P step (the step overwrites it with its own).
    const std::vector<float> pKept = p;
    const double tqd = bestSeconds(repeats, [&] {
      host::alternateStepQ(g.data(), lowrankFloat32, e.data(), v, p.data(), k, qt.data(),
                           INFINITY, lowrankFloat32, /*deferResidual=*/true);
    });
    const double tpd = bestSeconds(repeats, [&] {
      std::copy(pKept.begin(), pKept.end(), p.begin());
      host::alternateStepP(g.data(), lowrankFloat32, e.data(), v, qt.data(), k, p.data(),
                           INFINITY, lowrankFloat32, qt.data());
    });
    struct { const char* name; double bytes, t; } alt[] = {
        {"alternate P step", 12, tp}, {"alternate Q step", 20, tq},
        {"decompress, no E", 4, td}, {"alternate P + decompress", 16, tp + td},
        {"alternate Q + decompress", 24, tq + td},
        {"alt Q step, deferred", 12, tqd}, {"alt P step, Q's residual", 12, tpd},
        {"alt pair deferred + 2 dec", 32, tqd + tpd + 2 * td},
        {"alt pair + 2 decompress", 40, tq + tp + 2 * td}};
    for (auto& r : alt) {
      const double bw = r.bytes * count / r.t / 1e9;
      printf(" %4d %-24s %6.0f %10.2f %9.2f %8.0f%%\n", k, r.name, r.bytes, r.t * 1e3, bw,
             100 * bw / triadBw);
    }
  }
  return 0;
}
