// The inputs G_i of each comm rank: synthetic (deterministic per (comm rank, seed)) or real
// gradients read from safetensors files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"

namespace perf {

// The batched view of a flat buffer of `count` elements, the library's rule (DESIGN.md): near-square
// rows x cols with rows * cols = count, rows <= cols, cols / rows <= 4, rows the largest divisor
// <= sqrt(count); else a padded square ceil(sqrt(count))^2. Row-major: element e is (e / cols,
// e % cols).
struct MatrixView {
  size_t rows = 0, cols = 0, padded = 0;
};
MatrixView batchedView(size_t count);

struct SyntheticSpec {
  lowrankDataType_t type = lowrankFloat32;
  lowrankRedOp_t op = lowrankSum;
  bool exactRankK = true;  // true: sum_i G_i is exactly of rank k in `view`; false: decaying spectrum
  int k = 4;
  uint64_t seed = 0;
  MatrixView view;
};

// Fills `buf` (count elements of spec.type) with comm rank `rank`'s input.
//  - floating types, sum/avg/max/min, exactRankK: G_i = U C_i V^T (U rows x k and V cols x k shared
//    by all ranks, C_i k x k per rank, all entries in {-1, 0, 1} so that G_i is exact in every
//    floating dtype), rows of U that reach into the padding are zero, so the sum over ranks is
//    exactly of rank <= k in the batched view.
//  - floating types, !exactRankK: G_i = sum_{j<16} 0.7^j u_j v_j^T (shared) + 0.1 * noise_i.
//  - prod on floating types: 1 + 0.25 * uniform(-1, 1), so products stay near 1.
//  - integer types: small integers (int8 sums and all products cannot overflow
//    with up to 63 comm ranks; prod: +-1, and a few 2 on comm rank 0 only).
void makeSynthetic(void* buf, size_t count, int rank, const SyntheticSpec& spec);

// Real gradients of one comm rank: the tensors of one safetensors file in data-offset order.
struct Gradients {
  std::string file;
  std::vector<std::string> names;
  std::vector<std::vector<size_t>> shapes;  // a scalar becomes {1}
  std::vector<float> data;                  // the concatenation, float32
  size_t count() const { return data.size(); }
};

// Reads the file of comm rank `rank`: <dir>/<step>_worker<rank mod nfiles>.safetensors. Zero-size
// tensors are left out. Throws SafetensorsError on a missing or malformed file.
Gradients loadGradients(const std::string& dir, std::string* step, int rank);

// A hash of the layout (names excluded), to check that every comm rank has the same one.
uint64_t layoutHash(const Gradients& g);

}  // namespace perf
