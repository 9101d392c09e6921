// The saved state of one buffer (lowrankBufferSaveState / lowrankBufferRestoreState): what it holds,
// its bytes, and the checks of a restore. The bytes are described in lowrank.h and
// docs/checkpoint.md; this is their one encoder and decoder, for host and device buffers alike (the
// residual and Q have the same layout in both).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/engine_config.h"
#include "engine/plan.h"
#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank {

struct SavedState {
  static constexpr uint32_t kFormatVersion = 1;
  // Identity: the buffer and communicator the state belongs to.
  uint64_t count = 0;
  lowrankDataType_t dtype = lowrankFloat32;
  std::optional<Layout> layout;  // none: batched (one matrix)
  int32_t approxRank = 0;        // lowrankConfig_t.approxRank (k before clipping per tensor)
  int64_t seed = 0;
  int32_t nranks = 0, rank = 0;
  bool errorFeedback = false;    // residual holds count floats
  // Progress: calls made on the buffer since its plan, and whether qt holds a warm start.
  uint64_t calls = 0;
  bool haveQ = false;
  std::vector<float> residual;   // E: count floats when errorFeedback, else empty
  std::vector<float> qt;         // Qt of every compressed tensor (plan.qElems, whole-tensor layout)
};

// The bytes of s: encodedSize(s) of them written to out.
size_t encodedSize(const SavedState& s);
void encode(const SavedState& s, uint8_t* out);

// Parses and checks bytes (magic, format version, sizes that add up, CRC-32) into *out; *out is
// written only on success. Errors: lowrankInvalidArgument saying what is wrong (truncated, corrupt,
// foreign, another format version).
Status decode(const void* bytes, size_t size, SavedState* out);

// The checks of a restore that need no call: against the communicator (comm size and rank, k,
// seed, error feedback) and the layout set on the buffer, if any. Errors: lowrankInvalidUsage
// naming what differs (saved value and this one).
Status checkRestore(const SavedState& s, const EngineConfig& cfg, int rank, int nranks,
                    const std::optional<Layout>& layout);
// The checks when the call plans the buffer: count, dtype, layout, and the sizes of the plan's state.
// Errors: lowrankInvalidUsage naming what differs.
Status checkPlan(const SavedState& s, const Plan& plan, const std::optional<Layout>& layout,
                 bool errorFeedback);

// What every comm rank's restore must agree on, for the plan check (PlanCheck): the call count, the
// warm start and its Q (identical on every comm rank after a call; the residuals are each rank's
// own). Never 0, which stands for "nothing restored".
uint64_t agreementId(const SavedState& s);

}  // namespace lowrank
