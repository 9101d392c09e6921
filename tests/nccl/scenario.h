// The calls the NCCL tests make on a lowrank communicator, the same on a communicator over NCCL
// (lowrankCommInitFromNccl) and over UCX (lowrankCommInitRank), so that their outputs can be
// compared bit for bit: float32 and bfloat16, sum and avg, batched and per-tensor views, in place
// and not, several steps per buffer (warm start, error feedback). Public C API only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"

namespace ncclscenario {

inline uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return uint16_t(u >> 16);
}

// Smooth, rank- and call-dependent, with a low-rank part so that compression has work to do.
inline float input(int rank, int step, int buf, size_t i) {
  double x = double(i);
  return float(std::sin(0.011 * x + 0.7 * rank + 0.29 * step + buf) +
               0.4 * std::cos(0.0009 * x * (buf + 1)) * (1 + rank) +
               0.05 * double((i * 7919 + size_t(rank) * 31 + size_t(step) * 17) % 101) / 101.0);
}

struct BufSpec {
  lowrankDataType_t dtype;
  lowrankRedOp_t op;
  size_t count;
  bool inPlace;
  std::vector<std::vector<size_t>> layout;  // empty: batched
};

inline std::vector<BufSpec> specs() {
  return {
      {lowrankFloat32, lowrankSum, 3000, false, {}},                               // batched, small
      {lowrankBfloat16, lowrankAvg, 2500, true, {}},                               // batched, in place
      {lowrankFloat32, lowrankAvg, 48 * 40 + 40 + 8 * 6 * 5, false,
       {{48, 40}, {40}, {8, 6, 5}}},                                               // per tensor
      {lowrankBfloat16, lowrankSum, 32 * 64 + 64, true, {{32, 64}, {64}}},         // per tensor
      {lowrankFloat32, lowrankAvg, 24000, true, {}},                               // batched, chunked
  };
}
constexpr int kSteps = 3;

// Runs every buffer kSteps times on `comm` (comm rank `rank`), appending the raw outputs to *out.
// On error returns the code and sets *err.
inline lowrankResult_t run(lowrankComm_t comm, int rank, std::string* out, std::string* err) {
  const auto all = specs();
  std::vector<std::vector<uint8_t>> send(all.size()), recv(all.size());
  for (size_t b = 0; b < all.size(); ++b) {
    const BufSpec& s = all[b];
    const size_t es = s.dtype == lowrankFloat32 ? 4 : 2;
    send[b].resize(s.count * es);
    recv[b].resize(s.count * es);
    if (s.layout.empty()) continue;
    std::vector<int> ndims;
    std::vector<const size_t*> shapes;
    for (const auto& t : s.layout) {
      ndims.push_back(int(t.size()));
      shapes.push_back(t.data());
    }
    lowrankResult_t r = lowrankBufferSetLayout(comm, recv[b].data(), int(ndims.size()),
                                               ndims.data(), shapes.data());
    if (r != lowrankSuccess) {
      *err = std::string("lowrankBufferSetLayout: ") + lowrankGetLastError(comm);
      return r;
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    for (size_t b = 0; b < all.size(); ++b) {
      const BufSpec& s = all[b];
      std::vector<uint8_t>& in = s.inPlace ? recv[b] : send[b];
      for (size_t i = 0; i < s.count; ++i) {
        const float v = input(rank, step, int(b), i);
        if (s.dtype == lowrankFloat32) {
          std::memcpy(in.data() + 4 * i, &v, 4);
        } else {
          const uint16_t h = toBf16(v);
          std::memcpy(in.data() + 2 * i, &h, 2);
        }
      }
      lowrankResult_t r = lowrankAllReduce(in.data(), recv[b].data(), s.count, s.dtype, s.op, comm, nullptr);
      if (r != lowrankSuccess) {
        *err = "lowrankAllReduce (step " + std::to_string(step) + ", buffer " + std::to_string(b) +
               "): " + lowrankGetLastError(comm);
        return r;
      }
      out->append(reinterpret_cast<const char*>(recv[b].data()), recv[b].size());
    }
  }
  // The memory is freed next: its address may come back for another buffer (with a layout left).
  for (const auto& r : recv) lowrankBufferRelease(comm, r.data());
  return lowrankSuccess;
}

// The configuration both communicators of a comparison use.
inline lowrankConfig_t config(int pipeline) {
  lowrankConfig_t c = LOWRANK_CONFIG_INITIALIZER;
  c.approxRank = 4;
  c.seed = 11;
  c.pipeline = pipeline;
  return c;
}

}  // namespace ncclscenario
