// lowrank_wire_error: the rounding error of a factor allreduce with 16-bit factors on the host
// transport (LOWRANK_FACTOR_DTYPE; docs/design.md, "16-bit factors"), measured on real gradients.
//
// Each of N comm ranks (threads, one UCX transport each) reads its gradients (perf's
// --gradients files, <step>_worker<rank mod files>.safetensors), views every tensor of >= 2
// dimensions as rows x (numel / rows), and forms PowerSGD's two factors as the library does: P_i =
// M_i Q with a Q drawn from a fixed seed and orthonormalized (rank k), then Q_i = M_i^T Pbar with
// Pbar the orthonormalized mean of the float32 P sums. Each factor (all tensors' concatenated, the
// payload's shape) is allreduced with float32 factors and with bfloat16 and float16 ones, by each
// algorithm forced; printed: the relative error in norm of each against the float32 allreduce,
// ||x16 - x32|| / ||x32||, and the float32 one's against the sum in double.
// Usage: lowrank_wire_error <gradients dir> <step> <k> <N>...
#include <Eigen/Dense>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../src/inputs.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/wire.h"

using namespace lowrank;
using Mat = Eigen::MatrixXd;

namespace {

struct View {
  size_t offset, rows, cols;
};

std::vector<View> viewsOf(const perf::Gradients& g) {
  std::vector<View> v;
  size_t off = 0;
  for (const auto& s : g.shapes) {
    size_t numel = 1;
    for (size_t d : s) numel *= d;
    if (s.size() >= 2 && s[0] > 1 && numel / s[0] > 1) v.push_back({off, s[0], numel / s[0]});
    off += numel;
  }
  return v;
}

Mat orthonormal(Mat a) {
  Eigen::HouseholderQR<Mat> qr(a);
  return qr.householderQ() * Mat::Identity(a.rows(), a.cols());
}

Mat block(const perf::Gradients& g, const View& v) {
  Mat m(v.rows, v.cols);
  for (size_t i = 0; i < v.rows; ++i)
    for (size_t j = 0; j < v.cols; ++j) m(i, j) = g.data[v.offset + i * v.cols + j];
  return m;
}

// Runs one allreduce (sum) of each rank's x on a group of n with `algo` and `wire`; returns rank
// 0's result (every rank holds the same bits: the transport's tests).
std::vector<float> allreduce(int n, ucx::Algorithm algo, lowrankDataType_t wire,
                             std::vector<std::vector<float>> x) {
  lowrankUniqueId id;
  Status st = bootstrap::makeUniqueId(&id, 60);
  if (!st.ok()) { std::fprintf(stderr, "unique id: %s\n", st.msg.c_str()); std::exit(1); }
  std::vector<Status> sts(static_cast<size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      UcxTransportOptions o;
      o.algorithm = algo;
      std::unique_ptr<Transport> tr;
      sts[size_t(r)] = createUcxTransport(id, r, n, 60, o, &tr);
      if (!sts[size_t(r)].ok()) return;
      std::vector<float>& b = x[size_t(r)];
      sts[size_t(r)] = tr->allreduce(b.data(), b.size(), lowrankFloat32, lowrankSum,
                                     Wire{wire, 0, wire == lowrankFloat32 ? 0 : b.size()});
    });
  for (auto& th : t) th.join();
  for (auto& s : sts)
    if (!s.ok()) { std::fprintf(stderr, "allreduce: %s\n", s.msg.c_str()); std::exit(1); }
  return x[0];
}

double relDist(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), s += double(b[i]) * b[i];
  return std::sqrt(d / s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s <gradients dir> <step> <k> <N>...\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int k = std::atoi(argv[3]);
  const ucx::Algorithm algos[] = {ucx::Algorithm::Ring, ucx::Algorithm::HalvingDoubling,
                                  ucx::Algorithm::RecursiveDoubling, ucx::Algorithm::Direct};
  std::printf("# lowrank_wire_error %s %s k %d: relative error in norm of a factor allreduce with "
              "16-bit factors against the float32 one (and the float32 one's against a double sum)\n",
              dir.c_str(), argv[2], k);
  std::printf("%-6s %4s %-18s %10s %10s %10s\n", "factor", "N", "algorithm", "fp32/f64", "bf16", "fp16");
  for (int a = 4; a < argc; ++a) {
    const int n = std::atoi(argv[a]);
    std::vector<perf::Gradients> g(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      std::string step = argv[2];
      g[size_t(r)] = perf::loadGradients(dir, &step, r);
    }
    const std::vector<View> views = viewsOf(g[0]);
    std::mt19937 rng(42);
    std::normal_distribution<double> nd;
    // P_i = M_i Q, every tensor's rows x k, concatenated.
    std::vector<Mat> q;
    for (const View& v : views) {
      Mat m(v.cols, k);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
      q.push_back(orthonormal(m));
    }
    auto factors = [&](bool second, const std::vector<Mat>& pbar) {
      std::vector<std::vector<float>> x(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r)
        for (size_t t = 0; t < views.size(); ++t) {
          const Mat m = block(g[size_t(r)], views[t]);
          const Mat f = second ? Mat(m.transpose() * pbar[t]) : Mat(m * q[t]);
          for (Eigen::Index i = 0; i < f.size(); ++i) x[size_t(r)].push_back(float(f.data()[i]));
        }
      return x;
    };
    auto report = [&](const char* what, const std::vector<std::vector<float>>& x) {
      std::vector<float> exact(x[0].size(), 0.f);
      for (size_t i = 0; i < exact.size(); ++i) {
        double s = 0;
        for (int r = 0; r < n; ++r) s += x[size_t(r)][i];
        exact[i] = float(s);
      }
      for (ucx::Algorithm al : algos) {
        const auto f32 = allreduce(n, al, lowrankFloat32, x);
        const auto b16 = allreduce(n, al, lowrankBfloat16, x);
        const auto h16 = allreduce(n, al, lowrankFloat16, x);
        std::printf("%-6s %4d %-18s %10.3e %10.3e %10.3e\n", what, n, ucx::algorithmName(al),
                    relDist(f32, exact), relDist(b16, f32), relDist(h16, f32));
        std::fflush(stdout);
      }
      return exact;
    };
    const auto pSum = report("P", factors(false, {}));
    std::vector<Mat> pbar;
    size_t at = 0;
    for (const View& v : views) {
      Mat p(v.rows, k);
      for (Eigen::Index i = 0; i < p.size(); ++i) p.data()[i] = pSum[at + size_t(i)];
      at += size_t(p.size());
      pbar.push_back(orthonormal(p));
    }
    report("Q", factors(true, pbar));
  }
  return 0;
}
