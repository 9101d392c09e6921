#include "kernels/host/orthonormalize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lowrank::host {
namespace {

double norm(const double* x, size_t n) {
  double s = 0;
  for (size_t r = 0; r < n; ++r) s += x[r] * x[r];
  return std::sqrt(s);
}

// Gram-Schmidt, each projection done twice ("twice is enough", Giraud et al. 2005), so columns
// are orthogonal to float64 precision. A column whose norm falls to rounding level of what it
// was (dependent) or is zero becomes zero.
void gramSchmidt(double* a, size_t n, int k, double eps) {
  for (int j = 0; j < k; ++j) {
    double* c = a + size_t(j) * n;
    const double before = norm(c, n);
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < j; ++i) {
        const double* b = a + size_t(i) * n;
        double d = 0;
        for (size_t r = 0; r < n; ++r) d += b[r] * c[r];
        for (size_t r = 0; r < n; ++r) c[r] -= d * b[r];
      }
    }
    const double after = norm(c, n);
    if (!(after > 1e-12 * before) || after == 0) {
      for (size_t r = 0; r < n; ++r) c[r] = 0;
      continue;
    }
    const double inv = 1.0 / (after + eps);
    for (size_t r = 0; r < n; ++r) c[r] *= inv;
  }
}

// Reflects the columns c0 .. k-1 of a (n each) by the unit reflector v (rows from .. n-1):
// y -= 2 (v . y) v. Up to 4 columns a sweep: each dot product keeps its own sum, added in row order
// as one column at a time adds it (the same bits for finite input; where NaN meets an infinity the
// compiler's order of an addition's operands can flip a NaN's sign), so the sums' additions, whose
// latency bounds a float64 dot product here, overlap instead of running one after the other.
void reflect(double* a, size_t n, size_t from, int c0, int k, const double* v) {
  for (int c = c0; c < k; c += 4) {
    const int w = std::min(4, k - c);
    double* y[4];
    double d[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) y[i] = a + size_t(c + std::min(i, w - 1)) * n;
    for (size_t r = from; r < n; ++r) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) d[i] += v[r] * y[i][r];  // w < 4: the last column again, unused
    }
    for (int i = 0; i < w; ++i)
      for (size_t r = from; r < n; ++r) y[i][r] -= 2 * d[i] * v[r];
  }
}

// Householder QR, then the thin Q formed by applying the reflectors to the first k columns of I.
void householder(double* a, size_t n, int k) {
  std::vector<double> v(size_t(k) * n, 0.0);  // reflector j lives in v[j*n + j .. n)
  std::vector<char> active(k, 0);
  for (int j = 0; j < k; ++j) {
    double* x = a + size_t(j) * n;
    double* vj = v.data() + size_t(j) * n;
    const double nx = norm(x + j, n - j);
    if (nx == 0) continue;  // nothing to reflect: H_j = I
    const double alpha = x[j] >= 0 ? -nx : nx;
    for (size_t r = j; r < n; ++r) vj[r] = x[r];
    vj[j] -= alpha;
    const double nv = norm(vj + j, n - j);
    if (nv == 0) continue;
    for (size_t r = j; r < n; ++r) vj[r] /= nv;
    active[j] = 1;
    reflect(a, n, j, j, k, vj);  // A[j:, c] -= 2 v (v . A[j:, c]), c = j .. k-1
  }
  for (size_t i = 0; i < size_t(k) * n; ++i) a[i] = 0;
  for (int j = 0; j < k; ++j) a[size_t(j) * n + j] = 1;
  for (int j = k - 1; j >= 0; --j)
    if (active[j]) reflect(a, n, j, 0, k, v.data() + size_t(j) * n);
}

}  // namespace

void orthonormalize(float* a, size_t n, int k, size_t rowStride, size_t colStride, double eps) {
  if (k <= 0 || n == 0) return;
  // Column-major n x k copy, float64. Per call, not per thread: a thread would otherwise keep the
  // copy of the tallest P it ever saw (k * n doubles) after every buffer is released.
  std::vector<double> w(size_t(k) * n);
  for (int j = 0; j < k; ++j)
    for (size_t r = 0; r < n; ++r) w[size_t(j) * n + r] = a[r * rowStride + j * colStride];
  if (k <= 2) gramSchmidt(w.data(), n, k, eps);
  else householder(w.data(), n, k);
  for (int j = 0; j < k; ++j)
    for (size_t r = 0; r < n; ++r) a[r * rowStride + j * colStride] = float(w[size_t(j) * n + r]);
}

}  // namespace lowrank::host
