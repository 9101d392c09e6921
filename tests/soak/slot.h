// One live buffer of the soak: its memory on every comm rank, what the engine was told about it,
// and the reference of the error-feedback invariant since its state was last reset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lowrank/lowrank.h"
#include "soak/layouts.h"
#include "util/dtype.h"

namespace lowrank::soak {

struct Slot {
  int id = 0;                // creation order, for messages
  int set = 0;               // the communicator set it is allreduced on
  size_t capacityBytes = 0;  // its memory, per comm rank (count and dtype change within it)
  std::vector<std::vector<uint64_t>> mem;  // per comm rank: recvbuff (8-byte aligned)
  lowrankDataType_t dtype = lowrankFloat32;
  size_t count = 0;
  Shapes layout;        // empty: batched (one matrix)
  uint64_t signal = 0;  // stream of its low-rank signal, shared by every rank and call
  float scale = 1.f;

  // The invariant, per element, since the last reset of the buffer's state:
  //   d = sum over calls of (mean over ranks of G - output / (N for sum, 1 for avg)) = mean of E.
  std::vector<double> d;
  size_t calls = 0;   // calls on the state since its reset (warm-up calls included)
  double sumTol = 0;  // sum over those calls of the rounding each may leave (see Soak)
  double sumG = 0;    // sum over those calls of max |G|: the scale errors are measured in
  double maxE = 0;    // largest |E| (any rank) seen at a check since the reset

  void* recv(int rank) { return mem[size_t(rank)].data(); }
  size_t bytes() const { return count * dtypeSize(dtype); }
  // Forgets the history: the engine's state of this buffer was reset.
  void resetModel() {
    d.assign(count, 0.0);
    calls = 0;
    sumTol = sumG = maxE = 0;
  }
};

}  // namespace lowrank::soak
