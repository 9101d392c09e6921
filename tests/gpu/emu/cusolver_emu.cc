// The cuSOLVER entry points of kernels/cuda/dense_qr.h for the CPU emulation: a shared library
// that the emulated kernel tests load through LOWRANK_CUSOLVER_LIBRARY (emulated device memory
// is host memory). Eigen's Householder QR keeps LAPACK's conventions (the reflectors below the
// diagonal, tau, and no reflection of a column whose part below the diagonal is zero), which is
// what the device code must give the host's signs from. As cuSOLVER's, the factorizations are
// queued on the handle's stream (host_work.h); arguments are checked at the call.
#include <Eigen/Dense>

#include "host_work.h"

namespace {
using Mat = Eigen::Map<Eigen::MatrixXd, 0, Eigen::OuterStride<>>;
struct Handle {
  CUstream_st* stream = nullptr;
};
int onStream(void* h, const char* what, std::function<void()> work) {
  return emu::enqueueHostWork(static_cast<Handle*>(h)->stream, what, std::move(work)) ? 7 : 0;
}
}  // namespace

extern "C" {

int cusolverDnCreate(void** h) {
  *h = new Handle;
  return 0;
}
int cusolverDnDestroy(void* h) {
  delete static_cast<Handle*>(h);
  return 0;
}
int cusolverDnSetStream(void* h, void* stream) {
  static_cast<Handle*>(h)->stream = static_cast<CUstream_st*>(stream);
  return 0;
}

int cusolverDnDgeqrf_bufferSize(void*, int, int n, double*, int, int* lwork) {
  *lwork = n;
  return 0;
}
int cusolverDnDgeqrf(void* h, int m, int n, double* a, int lda, double* tau, double*, int lwork,
                     int* info) {
  if (m < n || lda < m || lwork < n) return 7;  // CUSOLVER_STATUS_INVALID_VALUE
  return onStream(h, "cusolverDnDgeqrf", [=] {
    Mat A(a, m, n, Eigen::OuterStride<>(lda));
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(A);
    A = qr.matrixQR();
    Eigen::Map<Eigen::VectorXd>(tau, n) = qr.hCoeffs();
    *info = 0;
  });
}

int cusolverDnDorgqr_bufferSize(void*, int, int n, int, const double*, int, const double*,
                                int* lwork) {
  *lwork = n;
  return 0;
}
int cusolverDnDorgqr(void* h, int m, int n, int k, double* a, int lda, const double* tau, double*,
                     int lwork, int* info) {
  if (m < n || n < k || lda < m || lwork < n) return 7;
  return onStream(h, "cusolverDnDorgqr", [=] {
    Mat A(a, m, n, Eigen::OuterStride<>(lda));
    const Eigen::MatrixXd vectors = A.leftCols(k);
    const Eigen::VectorXd coeffs = Eigen::Map<const Eigen::VectorXd>(tau, k);
    const Eigen::HouseholderSequence<Eigen::MatrixXd, Eigen::VectorXd> q(vectors, coeffs);
    A = q * Eigen::MatrixXd::Identity(m, n);
    *info = 0;
  });
}

}  // extern "C"
