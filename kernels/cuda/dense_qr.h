// cuSOLVER's dense QR in float64 (geqrf, then orgqr for the thin Q), reached through dlopen the
// first time an orthonormalization table has a matrix with k > 32, so that the CUDA backend
// neither links nor loads cuSOLVER (hundreds of MB with cuBLAS) for the usual ranks.
// The library: LOWRANK_CUSOLVER_LIBRARY (a path or soname) if set, else libcusolver.so.12, else
// libcusolver.so. Where none loads, those matrices are orthonormalized by the one-block kernel.
#pragma once
#include <cuda_runtime_api.h>

namespace lowrank::cuda::detail {

// The entry points used, with cuSOLVER's C signatures (cusolverDn.h; the handle is opaque here,
// status 0 is CUSOLVER_STATUS_SUCCESS). dense_qr.cc checks them against the real header.
struct DenseQrApi {
  using Handle = void*;
  int (*create)(Handle*) = nullptr;
  int (*destroy)(Handle) = nullptr;
  int (*setStream)(Handle, cudaStream_t) = nullptr;
  int (*geqrfBufferSize)(Handle, int m, int n, double* a, int lda, int* lwork) = nullptr;
  int (*geqrf)(Handle, int m, int n, double* a, int lda, double* tau, double* work, int lwork,
               int* devInfo) = nullptr;
  int (*orgqrBufferSize)(Handle, int m, int n, int k, const double* a, int lda, const double* tau,
                         int* lwork) = nullptr;
  int (*orgqr)(Handle, int m, int n, int k, double* a, int lda, const double* tau, double* work,
               int lwork, int* devInfo) = nullptr;
};

// The loaded API, or nullptr where cuSOLVER cannot be loaded (then *why says why). Loads once per
// process; thread safe.
const DenseQrApi* denseQrApi(const char** why = nullptr);

}  // namespace lowrank::cuda::detail
