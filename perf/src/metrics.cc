#include "metrics.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "dtypes.h"

namespace perf {

double relErr(const void* out, lowrankDataType_t type, const double* ref, size_t count) {
  double num = 0, den = 0;
  if (type == lowrankFloat32) {
    const float* o = static_cast<const float*>(out);
    for (size_t i = 0; i < count; ++i) {
      const double d = o[i] - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      const double d = loadAsDouble(out, type, i) - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
    }
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double relErrDouble(const double* out, const double* ref, double scale, size_t count) {
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    const double r = scale * ref[i];
    const double d = out[i] - r;
    num += d * d;
    den += r * r;
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double maxAbs(const double* v, size_t count) {
  double m = 0;
  for (size_t i = 0; i < count; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

double relTolerance(Mode mode, lowrankDataType_t type, int factorDtype) {
  if (!isFloating(type)) return 0.0;
  const bool factors16 = mode == Mode::PowerSgd && factorDtype != lowrankFloat32;
  if (type == lowrankBfloat16 || (factors16 && factorDtype == lowrankBfloat16)) return 3e-2;
  if (type == lowrankFloat16 || mode == Mode::Fp16 || factors16) return 1e-2;
  if (type == lowrankFloat64) return 1e-10;
  return 1e-4;
}

size_t countWrong(const void* out, lowrankDataType_t type, const double* ref, size_t count,
                  double tolAbs) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double o = loadAsDouble(out, type, i);
    const double r = ref[i];
    if (!std::isfinite(r)) {
      if (!(std::isnan(r) ? std::isnan(o) : o == r)) ++wrong;
      continue;
    }
    if (!(std::fabs(o - r) <= tolAbs)) ++wrong;  // NaN out counts as wrong
  }
  return wrong;
}

bool isCompressed(size_t rows, size_t cols, int k, double rate) {
  if (k <= 0 || rows == 0 || cols == 0) return false;
  const double kk = static_cast<double>(std::min({rows, cols, static_cast<size_t>(k)}));
  return (static_cast<double>(rows) + static_cast<double>(cols)) * kk * rate <
         static_cast<double>(rows) * static_cast<double>(cols);
}

double rankKErrorSq(const double* ref, size_t count, const MatrixSlice& s, int k) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Mat a = Mat::Zero(static_cast<Eigen::Index>(s.rows), static_cast<Eigen::Index>(s.cols));
  for (size_t r = 0; r < s.rows; ++r)
    for (size_t c = 0; c < s.cols; ++c) {
      const size_t e = s.offset + r * s.cols + c;
      if (e < count) a(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = ref[e];
    }
  const double total = a.squaredNorm();
  Eigen::MatrixXd gram;
  if (s.rows <= s.cols) {
    gram = Eigen::MatrixXd::Zero(a.rows(), a.rows());
    gram.selfadjointView<Eigen::Lower>().rankUpdate(a);  // A A^T
  } else {
    gram = Eigen::MatrixXd::Zero(a.cols(), a.cols());
    gram.selfadjointView<Eigen::Lower>().rankUpdate(a.transpose());  // A^T A
  }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(gram, Eigen::EigenvaluesOnly);
  const auto& ev = es.eigenvalues();  // ascending
  const Eigen::Index kk = std::min<Eigen::Index>(k, ev.size());
  double top = 0;
  for (Eigen::Index i = 0; i < kk; ++i) top += std::max(0.0, ev(ev.size() - 1 - i));
  return std::max(0.0, total - top);
}

std::optional<double> relErrOpt(const double* ref, size_t count,
                                const std::vector<MatrixSlice>& matrices, int k, double rate,
                                size_t maxSide) {
  double den = 0;
  for (size_t i = 0; i < count; ++i) den += ref[i] * ref[i];
  double errSq = 0;
  for (const auto& s : matrices) {
    if (!isCompressed(s.rows, s.cols, k, rate)) continue;  // sent exactly: no error
    if (std::min(s.rows, s.cols) > maxSide) return std::nullopt;
    errSq += rankKErrorSq(ref, count, s, k);
  }
  if (den == 0) return errSq == 0 ? std::optional<double>(0.0) : std::nullopt;
  return std::sqrt(errSq / den);
}

}  // namespace perf
