// One step of the soak: the allreduce every comm rank makes, and what each rank measured over its
// share of the elements (the references are computed by all ranks, each on a slice).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lowrank/lowrank.h"
#include "soak/slot.h"

namespace lowrank::soak {

enum class CallKind {
  kCompressed,  // sum or avg of a compressible dtype on a slot: PowerSGD (or its warm-up)
  kFallback,    // the same with a NaN on one rank: every rank falls back to the exact allreduce
  kExactSlot,  // an exact op (prod, max, min, or another dtype) on a slot's memory: state untouched
  kExactTemp,  // an exact op on a buffer of its own, freed after the call
};

// Bytes for one call's buffers, not zeroed (every element read is written first): zeroing 16 M
// elements on every rank at every call would cost more than making the input.
struct Words {
  std::unique_ptr<uint64_t[]> p;
  explicit Words(size_t bytes)
      : p(std::make_unique_for_overwrite<uint64_t[]>(std::max<size_t>(1, (bytes + 7) / 8))) {}
  uint64_t* data() { return p.get(); }
  const uint64_t* data() const { return p.get(); }
};

struct Step {
  size_t index = 0;  // 0-based call number
  CallKind kind = CallKind::kCompressed;
  Slot* slot = nullptr;  // kCompressed, kFallback, kExactSlot
  int set = 0;
  size_t count = 0;
  lowrankDataType_t dtype = lowrankFloat32;
  lowrankRedOp_t op = lowrankSum;
  bool inPlace = false;
  bool check = false;    // compare with the reference after the call
  bool corrupt = false;  // Options::corruptResidualFrom: comm rank 0 moves E[0] before the check
  uint64_t inputs = 0;   // stream of this call's inputs (mixed with the comm rank)
  int nanRank = -1;      // kFallback: the rank whose input holds a NaN, at nanIndex
  size_t nanIndex = 0;
  std::vector<void*> send, recv;         // per comm rank
  std::vector<Words> sendMem;            // out-of-place inputs, per comm rank
  std::vector<Words> tempMem;            // kExactTemp: its recvbuffs
  std::optional<Words> expected;         // checked exact calls: the reference, in the dtype
  std::vector<lowrankResult_t> results;  // per comm rank
};

// What one comm rank found on its slice of the elements.
struct Partial {
  double maxG = 0;    // largest |G| of any rank
  double maxOut = 0;  // largest |output| (divided by N for sum)
  double maxErr = 0;  // kCompressed: largest |d - mean E|; kFallback: |out - mean G|
  double maxE = 0;    // largest |E| of any rank (checked calls)
  size_t differ = 0;  // elements whose output differs between comm ranks
  size_t wrong = 0;   // exact calls: elements not equal to the reference; fallback: NaN lost
};

}  // namespace lowrank::soak
