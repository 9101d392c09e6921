// A minimal safetensors reader: 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
// F32, F16 and BF16 tensors are read (converted to float32); anything malformed is rejected with
// an exception whose message names the file and the problem.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace perf {

struct Tensor {
  std::string name;
  std::string dtype;           // as in the file: F32, F16, BF16
  std::vector<size_t> shape;   // empty for a scalar
  size_t begin = 0, end = 0;   // data_offsets
  std::vector<float> data;     // prod(shape) values
  size_t numel() const;
};

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// All tensors of the file, ordered by data offset.
std::vector<Tensor> loadSafetensors(const std::string& path);

// The files <dir>/<step>_worker<i>.safetensors for i = 0, 1, ... (stops at the first missing i).
// An empty step picks the smallest prefix that has a _worker0 file. Throws if none.
std::vector<std::string> findWorkerFiles(const std::string& dir, std::string* step);

}  // namespace perf
