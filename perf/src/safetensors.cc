#include "safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtypes.h"

namespace perf {

size_t Tensor::numel() const {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  return n;
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw SafetensorsError(path + ": not a valid safetensors file: " + what);
}

size_t elemSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

}  // namespace

std::vector<Tensor> loadSafetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw SafetensorsError(path + ": cannot open: " + std::strerror(errno));
  f.seekg(0, std::ios::end);
  const std::streamoff fileSize = f.tellg();
  f.seekg(0);
  if (fileSize < 8) bad(path, "shorter than the 8-byte header length");
  unsigned char lenBytes[8];
  f.read(reinterpret_cast<char*>(lenBytes), 8);
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i) headerLen = (headerLen << 8) | lenBytes[i];
  if (headerLen == 0 || headerLen > static_cast<uint64_t>(fileSize - 8) ||
      headerLen > (100u << 20)) {
    bad(path, "header length " + std::to_string(headerLen) + " does not fit a file of " +
                  std::to_string(fileSize) + " bytes");
  }
  std::string header(headerLen, '\0');
  f.read(header.data(), static_cast<std::streamsize>(headerLen));
  if (!f) bad(path, "truncated header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    bad(path, std::string("header is not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "header is not a JSON object");
  const uint64_t dataSize = static_cast<uint64_t>(fileSize) - 8 - headerLen;

  std::vector<Tensor> tensors;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    const std::string where = "tensor '" + it.key() + "'";
    if (!v.is_object()) bad(path, where + " is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad(path, where + " has no dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) bad(path, where + " has no shape");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      bad(path, where + " has no data_offsets [begin, end]");
    Tensor t;
    t.name = it.key();
    t.dtype = v["dtype"].get<std::string>();
    const size_t es = elemSize(t.dtype);
    if (es == 0) bad(path, where + " has dtype " + t.dtype + " (F32, F16, BF16 supported)");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad(path, where + " has a shape entry that is not a size");
      t.shape.push_back(d.get<size_t>());
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad(path, where + " has a data offset that is not a size");
    t.begin = v["data_offsets"][0].get<size_t>();
    t.end = v["data_offsets"][1].get<size_t>();
    if (t.begin > t.end || t.end > dataSize)
      bad(path, where + " has data_offsets outside the " + std::to_string(dataSize) +
                    " bytes of data");
    if ((t.end - t.begin) != t.numel() * es)
      bad(path, where + " has " + std::to_string(t.end - t.begin) + " bytes of data for " +
                    std::to_string(t.numel()) + " elements of " + t.dtype);
    tensors.push_back(std::move(t));
  }
  if (tensors.empty()) bad(path, "no tensors");
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor& a, const Tensor& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].begin < tensors[i - 1].end && tensors[i].begin != tensors[i].end)
      bad(path, "tensors '" + tensors[i - 1].name + "' and '" + tensors[i].name + "' overlap");

  const std::streamoff dataStart = 8 + static_cast<std::streamoff>(headerLen);
  std::vector<char> raw;
  for (auto& t : tensors) {
    raw.resize(t.end - t.begin);
    f.seekg(dataStart + static_cast<std::streamoff>(t.begin));
    f.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    if (!f) bad(path, "truncated data of tensor '" + t.name + "'");
    const size_t n = t.numel();
    t.data.resize(n);
    if (t.dtype == "F32") {
      std::memcpy(t.data.data(), raw.data(), n * 4);  // little-endian host assumed (x86, arm64)
    } else {
      const bool half = t.dtype == "F16";
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        t.data[i] = half ? halfToFloat(h) : bf16ToFloat(h);
      }
    }
  }
  return tensors;
}

std::vector<std::string> findWorkerFiles(const std::string& dir, std::string* step) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw SafetensorsError(dir + ": not a directory");
  if (step->empty()) {
    const std::string suffix = "_worker0.safetensors";
    std::vector<std::string> prefixes;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        prefixes.push_back(name.substr(0, name.size() - suffix.size()));
    }
    if (prefixes.empty())
      throw SafetensorsError(dir + ": no <step>_worker0.safetensors file");
    std::sort(prefixes.begin(), prefixes.end());
    *step = prefixes.front();
  }
  std::vector<std::string> files;
  for (int i = 0;; ++i) {
    const fs::path p = fs::path(dir) / (*step + "_worker" + std::to_string(i) + ".safetensors");
    if (!fs::exists(p, ec)) break;
    files.push_back(p.string());
  }
  if (files.empty())
    throw SafetensorsError(dir + ": no " + *step + "_worker0.safetensors file");
  return files;
}

}  // namespace perf
