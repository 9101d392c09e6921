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

// Format version 2: the state of tensors declared with ids (lowrankBufferSetTensors), one entry
// per id, so that it can be restored into any bucketing of the same tensors.
struct SavedTensor {
  uint64_t id = 0;
  Shape shape;
  int32_t k = 0;        // the rank Qt was made at (0: the tensor was not compressed)
  uint64_t calls = 0;   // calls the id has made (its warm-up and the draw of its next fresh Q)
  bool haveQ = false;   // qt holds its warm start (k x cols floats)
  // Alternating PowerSGD: its next compressed call is a Q step, against the kept Pbar in p
  // (rows x k floats, rows of its view); else p is empty and the next step is a P step.
  bool qStep = false;
  std::vector<float> residual;  // numel floats when error feedback is on, else empty
  std::vector<float> qt;
  std::vector<float> p;
};
struct SavedTensors {
  static constexpr uint32_t kFormatVersion = 2;
  int64_t seed = 0;
  int32_t nranks = 0, rank = 0;
  bool errorFeedback = false;
  // Saved by a buffer without ids: each id is the tensor's position in that buffer's layout (a
  // batched buffer: one tensor, shape {count}, its Q of the batched view), and the state restores
  // into a buffer of that layout, by position.
  bool byPosition = false;
  std::vector<SavedTensor> tensors;
};

// The format version of saved bytes (0 when they are not lowrank's or too short to say).
uint32_t formatVersion(const void* bytes, size_t size);

// The bytes of s: encodedSize(s) of them written to out. The library writes format 2 only (every
// buffer saves per tensor); format 1's encoder stays beside its decoder for the tests and the
// fuzzer, which make format-1 bytes with it.
size_t encodedSize(const SavedState& s);
void encode(const SavedState& s, uint8_t* out);

// Parses and checks bytes (magic, format version, sizes that add up, CRC-32) into *out; *out is
// written only on success. Errors: lowrankInvalidArgument saying what is wrong (truncated, corrupt,
// foreign, another format version).
Status decode(const void* bytes, size_t size, SavedState* out);
size_t encodedSize(const SavedTensors& s);
void encode(const SavedTensors& s, uint8_t* out);
// The same for format version 2 (also refuses an id given twice, and tensor sizes that do not
// match their shape, rank and error feedback).
Status decode(const void* bytes, size_t size, SavedTensors* out);
// The checks of a format-2 restore against the communicator (comm size and rank, seed, error
// feedback). Errors: lowrankInvalidUsage naming what differs.
Status checkRestore(const SavedTensors& s, const EngineConfig& cfg, int rank, int nranks);
// What every comm rank's restore of one tensor must agree on (calls, warm start, its Q).
uint64_t agreementId(const SavedTensor& t);

// The checks of a restore that need no call: against the communicator (comm size and rank, k,
// seed, error feedback) and the layout set on the buffer, if any. Errors: lowrankInvalidUsage
// naming what differs (saved value and this one).
Status checkRestore(const SavedState& s, const EngineConfig& cfg, int rank, int nranks,
                    const std::optional<Layout>& layout);
// Tensor t of a plan as a saved tensor: its slices of the plan's whole residual and Qt (host
// copies; residual empty without error feedback), the one place a tensor's state is cut out.
// p: the plan's whole P area (pElems floats), the kept Pbar of a record whose next call is a Q
// step (qStep), else empty.
SavedTensor sliceOf(const TensorPlan& t, uint64_t id, const Shape& shape, uint64_t calls,
                    bool haveQ, const std::vector<float>& residual, const std::vector<float>& qt,
                    bool qStep = false, const std::vector<float>& p = {});
// A format-1 state as per-tensor states by position (SavedTensors::byPosition), cut where its
// buffer's plan kept each tensor. Errors: lowrankInvalidUsage when its Q does not fit that plan
// (another min compression rate).
Status tensorsOf(const SavedState& s, const EngineConfig& cfg, SavedTensors* out);
// A restore by position: the shapes saved (a batched buffer's: {count}) against a buffer's layout
// (none: batched, of count elements). Errors: lowrankInvalidUsage naming both.
Status sameLayout(const Layout& saved, const std::optional<Layout>& now, size_t count);

// Format-1 bytes (a buffer's state, saved before tensor ids) with `calls` added to their call count,
// in place, under a new CRC-32; every other byte stays as saved. What a caller whose warm-up did
// not go through the library adds (lowrank.torch's hook of format 1 counted its warm-up steps
// itself: lowrankStateAddCalls). Errors: lowrankInvalidArgument, nothing changed: bytes that are
// not whole format-1 bytes (decode's checks), a count that would pass 2^62.
Status addCalls(void* bytes, size_t size, uint64_t calls);

}  // namespace lowrank
