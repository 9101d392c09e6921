// The cuSOLVER entry points of kernels/cuda/dense_qr.h for the CPU emulation: a shared library
// that the emulated kernel tests load through LOWRANK_CUSOLVER_LIBRARY (emulated device memory
// is host memory). Eigen's Householder QR keeps LAPACK's conventions (the reflectors below the
// diagonal, tau, and no reflection of a column whose part below the diagonal is zero), which is
// what the device code must give the host's signs from.
#include <Eigen/Dense>

namespace {
using Mat = Eigen::Map<Eigen::MatrixXd, 0, Eigen::OuterStride<>>;
int handleStorage;
}  // namespace

extern "C" {

int cusolverDnCreate(void** h) {
  *h = &handleStorage;
  return 0;
}
int cusolverDnDestroy(void*) { return 0; }
int cusolverDnSetStream(void*, void*) { return 0; }

int cusolverDnDgeqrf_bufferSize(void*, int, int n, double*, int, int* lwork) {
  *lwork = n;
  return 0;
}
int cusolverDnDgeqrf(void*, int m, int n, double* a, int lda, double* tau, double*, int lwork,
                     int* info) {
  if (m < n || lda < m || lwork < n) return 7;  // CUSOLVER_STATUS_INVALID_VALUE
  Mat A(a, m, n, Eigen::OuterStride<>(lda));
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(A);
  A = qr.matrixQR();
  Eigen::Map<Eigen::VectorXd>(tau, n) = qr.hCoeffs();
  *info = 0;
  return 0;
}

int cusolverDnDorgqr_bufferSize(void*, int, int n, int, const double*, int, const double*,
                                int* lwork) {
  *lwork = n;
  return 0;
}
int cusolverDnDorgqr(void*, int m, int n, int k, double* a, int lda, const double* tau, double*,
                     int lwork, int* info) {
  if (m < n || n < k || lda < m || lwork < n) return 7;
  Mat A(a, m, n, Eigen::OuterStride<>(lda));
  const Eigen::MatrixXd vectors = A.leftCols(k);
  const Eigen::VectorXd coeffs = Eigen::Map<const Eigen::VectorXd>(tau, k);
  const Eigen::HouseholderSequence<Eigen::MatrixXd, Eigen::VectorXd> h(vectors, coeffs);
  A = h * Eigen::MatrixXd::Identity(m, n);
  *info = 0;
  return 0;
}

}  // extern "C"
