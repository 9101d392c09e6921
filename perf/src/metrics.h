// Accuracy metrics of one allreduce output against the exact reference (double).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "args.h"
#include "lowrank/lowrank.h"

namespace perf {

// ||out - ref|| / ||ref|| (Frobenius over the whole buffer); out is `count` elements of `type`.
// 0 when ref is zero and out equals it.
double relErr(const void* out, lowrankDataType_t type, const double* ref, size_t count);
// The same with a double output (sums of outputs for cumrelerr) against scale * ref.
double relErrDouble(const double* out, const double* ref, double scale, size_t count);

double maxAbs(const double* v, size_t count);

// Relative tolerance of #wrong: float32 (powersgd, exact) 1e-4, half or mode fp16 1e-2,
// bfloat16 3e-2, double 1e-10; integer types are compared exactly (avg: within 1). PowerSGD with
// 16-bit factors (factorDtype, lowrankConfig_t's; LOWRANK_FACTOR_DTYPE): as the factors' type,
// the factors' rounding (2^-9 bf16, 2^-12 fp16 relative) being what the exact rank-k inputs then
// get back.
double relTolerance(Mode mode, lowrankDataType_t type, int factorDtype = lowrankFloat32);

// Elements with |out - ref| > tolAbs, a non-finite out where ref is finite counted too.
size_t countWrong(const void* out, lowrankDataType_t type, const double* ref, size_t count,
                  double tolAbs);

// One matrix of the reference, as the library views it: rows x cols, row-major from `offset` in
// the flat buffer; elements past `count` (batched padding) are zero.
struct MatrixSlice {
  size_t offset = 0, rows = 0, cols = 0;
};

// The library's compression test: (n + m) * min(n, m, k) * rate < n * m.
bool isCompressed(size_t rows, size_t cols, int k, double rate);

// Error of the best rank-k approximation of one matrix (truncated SVD, Eckart-Young), squared:
// ||A||^2 - sum of the k largest eigenvalues of the smaller Gram matrix (double, Eigen's
// SelfAdjointEigenSolver), clamped at 0.
double rankKErrorSq(const double* ref, size_t count, const MatrixSlice& s, int k);

// relerr_opt = sqrt(sum over compressed matrices of rankKErrorSq) / ||ref||. nullopt when a
// compressed matrix has min(rows, cols) > maxSide (too slow).
std::optional<double> relErrOpt(const double* ref, size_t count,
                                const std::vector<MatrixSlice>& matrices, int k, double rate,
                                size_t maxSide = 2048);

}  // namespace perf
