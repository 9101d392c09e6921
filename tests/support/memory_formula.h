// docs/cuda.md's formula ("Memory") of the bytes a buffer's state holds, for the tests of
// lowrankBufferGetMemory on host and device buffers. Shapes as lowrankBufferSetLayout's; every
// tensor of >= 2 dimensions is taken as compressed at rank k (choose shapes that pass the
// compression test), viewed as n = shape[0] by m = the rest. The device workspace is the
// orthonormalization's one-block term alone: shapes with n <= 256, m <= 512 and n k, m k < 4096
// (no multi-block or cuSOLVER path, no partial sums of passes 1 and 2). alternate: ACP-SGD's
// plan, whose Q wire holds a Q step's payload (exact part | Q | 2 checks: Plan::qWireElems),
// and on the host the last Q step's own Q.
// factors16: 16-bit factors (LOWRANK_FACTOR_DTYPE bf16 / fp16), whose device scratch is workspace.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "lowrank/lowrank.h"

namespace lowrank::testing {

inline lowrankMemoryInfo_t memoryFormula(const std::vector<std::vector<size_t>>& shapes, size_t k,
                                         bool device, bool alternate = false,
                                         bool factors16 = false) {
  size_t count = 0, exact = 0, nk = 0, mk = 0, ortho = 0;
  for (const auto& s : shapes) {
    size_t numel = 1;
    for (size_t d : s) numel *= d;
    count += numel;
    if (s.size() < 2) {
      exact += numel;
      continue;
    }
    const size_t n = s[0], m = numel / n;
    nk += n * k;
    mk += m * k;
    ortho += (2 * n * k + k) + (2 * m * k + k);  // P's and Qt's, float64
  }
  lowrankMemoryInfo_t f = LOWRANK_MEMORY_INFO_INITIALIZER;
  f.planned = 1;
  f.device = device;
  f.residualBytes = 4 * count;  // error feedback on
  f.factorBytes = 2 * 4 * mk + (alternate ? 4 * (exact + 2) : 0);
  if (alternate && !device) f.factorBytes += 4 * mk;  // the last Q step's own Q (host_backend.h)
  f.payloadBytes = 4 * (exact + nk + 2);
  if (device) {
    f.workspaceBytes = 8 * ortho;
    if (factors16) f.workspaceBytes += 2 * (nk > mk ? nk : mk);  // the factors as they travel
    f.pinnedBytes = 64;  // the ring of 4 calls' 2 check floats, in a 64-byte block
  }
  return f;
}

// got equals the formula in every field the formula gives (tables: whatever they take), and the
// total is the sum of the parts.
inline void expectMemoryFormula(const lowrankMemoryInfo_t& got, const lowrankMemoryInfo_t& want) {
  EXPECT_EQ(got.planned, want.planned);
  EXPECT_EQ(got.device, want.device);
  EXPECT_EQ(got.residualBytes, want.residualBytes);
  EXPECT_EQ(got.factorBytes, want.factorBytes);
  EXPECT_EQ(got.payloadBytes, want.payloadBytes);
  EXPECT_EQ(got.workspaceBytes, want.workspaceBytes);
  EXPECT_EQ(got.pinnedBytes, want.pinnedBytes);
  if (!want.device) {
    EXPECT_EQ(got.tableBytes, 0u);
  }
  EXPECT_EQ(got.totalBytes, got.residualBytes + got.factorBytes + got.payloadBytes +
                                got.workspaceBytes + got.tableBytes + got.pinnedBytes);
}

}  // namespace lowrank::testing
