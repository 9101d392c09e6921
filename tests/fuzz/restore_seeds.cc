// Writes the seed corpus of fuzz_restore (tests/fuzz/corpus/restore): the bytes
// lowrankBufferSaveState gives for small buffers of a one-rank communicator, through the public C
// API, so that the seeds are what the library really saves:
//   per_tensor    float32, layout (12,10) (10) (6,5), k 2, error feedback on, 3 calls
//   batched       bfloat16, 300 elements (one matrix), k 2, error feedback on, 3 calls
//   batched_no_ef float16, 200 elements, k 3, error feedback off, 2 calls
// Regenerate (after a change of the format): build/tests/fuzz/restore_seeds tests/fuzz/corpus/restore
// (the other files there, gen0 and gen1, are choices for the target's generated states.)
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"

namespace {

int failed(const char* what, lowrankComm_t comm) {
  std::fprintf(stderr, "restore_seeds: %s: %s\n", what, lowrankGetLastError(comm));
  return 1;
}

// Makes `calls` calls of a buffer of `count` elements of `dtype` (values from i and the call), then
// saves its state to dir/name.
int seed(const std::string& dir, const char* name, int approxRank, int errorFeedback,
         lowrankDataType_t dtype, size_t count, const std::vector<std::vector<size_t>>& layout,
         int calls) {
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = approxRank;
  cfg.errorFeedback = errorFeedback;
  lowrankUniqueId id;
  lowrankComm_t comm;
  if (lowrankGetUniqueId(&id) != lowrankSuccess) return failed("lowrankGetUniqueId", nullptr);
  if (lowrankCommInitRankConfig(&comm, 1, id, 0, &cfg) != lowrankSuccess)
    return failed("lowrankCommInitRankConfig", nullptr);
  const size_t esz = dtype == lowrankFloat32 ? 4 : 2;
  std::vector<uint8_t> send(count * esz), recv(count * esz);
  if (!layout.empty()) {
    std::vector<int> ndims;
    std::vector<const size_t*> shapes;
    for (const auto& s : layout) {
      ndims.push_back(int(s.size()));
      shapes.push_back(s.data());
    }
    if (lowrankBufferSetLayout(comm, recv.data(), int(ndims.size()), ndims.data(), shapes.data()))
      return failed("lowrankBufferSetLayout", comm);
  }
  for (int c = 0; c < calls; ++c) {
    for (size_t i = 0; i < count; ++i) {
      const float v = float(int((i * 37 + size_t(c) * 11) % 29) - 14) / 8.f;  // exact in half
      if (esz == 4) {
        std::memcpy(&send[4 * i], &v, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        uint16_t h;
        if (dtype == lowrankBfloat16) {
          h = uint16_t(u >> 16);  // v has few mantissa bits: no rounding
        } else {  // float16 of a small multiple of 1/8: sign, exponent rebiased, 10 mantissa bits
          const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
          h = uint16_t(v == 0 ? 0 : sign | ((exp - 127 + 15) << 10) | (man >> 13));
        }
        std::memcpy(&send[2 * i], &h, 2);
      }
    }
    if (lowrankAllReduce(send.data(), recv.data(), count, dtype, lowrankSum, comm, nullptr))
      return failed("lowrankAllReduce", comm);
  }
  size_t size = 0;
  if (lowrankBufferSaveState(comm, recv.data(), nullptr, &size))
    return failed("lowrankBufferSaveState", comm);
  std::vector<uint8_t> bytes(size);
  if (lowrankBufferSaveState(comm, recv.data(), bytes.data(), &size))
    return failed("lowrankBufferSaveState", comm);
  lowrankCommDestroy(comm);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, size, f) != size || std::fclose(f) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  std::printf("%s: %zu bytes\n", path.c_str(), size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: restore_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  return seed(dir, "per_tensor", 2, 1, lowrankFloat32, 12 * 10 + 10 + 6 * 5, {{12, 10}, {10}, {6, 5}},
              3) ||
         seed(dir, "batched", 2, 1, lowrankBfloat16, 300, {}, 3) ||
         seed(dir, "batched_no_ef", 3, 0, lowrankFloat16, 200, {}, 2);
}
