// Orthonormalization of the k columns of a tall-skinny matrix (P, n x k; or Q), in float64.
// k <= 2: Gram-Schmidt with reorthogonalization and PyTorch's epsilon (column / (norm + eps));
// k > 2: Householder QR (thin Q), unconditionally orthonormal even for rank-deficient input.
// A zero or linearly dependent column never yields NaN: Gram-Schmidt makes it zero, Householder
// completes the basis. Source: PowerSGD (Vogels et al. 2019), Algorithm 1 line 4; Householder per
// Golub & Van Loan, Matrix Computations, Algorithm 5.2.1.
#pragma once
#include <cstddef>

namespace lowrank::host {

// Element (r, j) of the n x k matrix is a[r * rowStride + j * colStride] (P: rowStride k, colStride
// 1; Qt: rowStride 1, colStride m). Requires k <= n. Deterministic: the same input gives the same
// bits. Not thread-safe across calls sharing `a`; reentrant otherwise.
void orthonormalize(float* a, size_t n, int k, size_t rowStride, size_t colStride, double eps);

}  // namespace lowrank::host
