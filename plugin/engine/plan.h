// The plan of a buffer, made at its first call and executed at every call: how the flat buffer is
// viewed (one matrix, or a list of tensors), which tensors are compressed, with which approximation
// rank, and where each one's factors sit in the packed factor buffers.
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "abi/cuda_backend.h"  // lowrankPayload, LOWRANK_PLAN_CHECK_WORDS
#include "engine/engine_config.h"
#include "kernels/host/powersgd_kernels.h"
#include "lowrank/lowrank.h"
#include "transport/wire.h"
#include "util/status.h"

namespace lowrank {

using Shape = std::vector<size_t>;
using Layout = std::vector<Shape>;  // tensor shapes in buffer order

// The tensors of a buffer declared with ids (lowrankBufferSetTensors), in layout order: each one's
// id and treatment (LOWRANK_RANK_DEFAULT, LOWRANK_RANK_EXACT or a rank of its own).
struct TensorIds {
  std::vector<uint64_t> ids;
  std::vector<int> ranks;
  bool operator==(const TensorIds& o) const { return ids == o.ids && ranks == o.ranks; }
};

struct TensorPlan {
  size_t offset = 0;     // first element in the buffer
  size_t numel = 0;
  bool compressed = false;
  host::MatrixView view;  // compressed: (shape[0], prod(shape[1:])), or the batched view
  int k = 0;             // approximation rank, clipped to min(n, m)
  size_t pOffset = 0;    // compressed: P at payload[exactElems + pOffset .. + n k)
  size_t qOffset = 0;    // compressed: Qt at qt[qOffset .. + k m)
  size_t exactOffset = 0;  // exact: at payload[exactOffset .. + numel)
  size_t lastPChunk = 0;   // pipelined: the P chunk that completes this tensor's P
  uint64_t id = 0;         // declared with ids: the tensor's id (its first Q is drawn from it)
};

// The schedule's chunks: P by row blocks, Q and decompression by column blocks, grouped in chunks
// (of about EngineConfig::pipelineChunk elements of M when plan.pipelined, else one per phase);
// each chunk's factors are one contiguous slice, allreduced while the next chunk is computed.
struct RowBlock { size_t tensor, r0, r1; };
struct ColBlock { size_t tensor, c0, c1, wireOffset; };  // its Qt (k x (c1 - c0)) at qwire[wireOffset]
struct Chunk {
  size_t first = 0, last = 0;     // blocks [first, last)
  size_t offset = 0, count = 0;   // the slice allreduced: payload (P chunks) or qwire (Q chunks)
};

struct Plan {
  size_t count = 0;
  lowrankDataType_t dtype = lowrankFloat32;
  bool perTensor = false;
  bool synthetic = false;  // a buffer without ids: its tensors' ids are their positions
  std::vector<TensorPlan> tensors;
  size_t pElems = 0, qElems = 0, exactElems = 0, compressedElems = 0;
  size_t rows = 0, cols = 0, padded = 0;  // batched view (0 in per-tensor mode)
  uint64_t hash = 0;  // of (count, dtype, op, layout, k): ranks compare it when the plan is made

  // Payload of allreduce #1: lowrankPayload (abi/cuda_backend.h), the layout both schedules use.
  lowrankPayloadLayout_t payload() const { return lowrankPayload(exactElems, pElems); }
  // Alternating (ACP-SGD): a Q step's one allreduce, the same layout with Q in P's place:
  // [exact part | Qt by column blocks, as the Q chunks travel (qElems) | checks]. Its Q part is the
  // Q wire; PowerSGD's Q wire is qElems floats alone.
  bool alternate = false;
  lowrankPayloadLayout_t qPayload() const { return lowrankPayload(exactElems, qElems); }
  uint64_t qWireElems() const { return alternate ? qPayload().elems : qElems; }
  // Bytes of a buffer's state under this plan, host or device alike: the float32 residual (error
  // feedback), the payload, Qt and its wire copy (HostState, cuda's DeviceBuffer); a backend may
  // keep more (BufferBackend::stateBytes: what lowrankStats_t.stateBytes counts, and what a
  // failed allocation says it could not get).
  // Alternating, P of the payload is also the kept factor between a P step and the next Q step.
  uint64_t stateBytes(bool errorFeedback) const {
    return sizeof(float) * (uint64_t(errorFeedback ? count : 0) + payload().elems + qElems + qWireElems());
  }

  // The dtype the factors travel in (LOWRANK_FACTOR_DTYPE; the hash covers it when not float32).
  lowrankDataType_t factorDtype = lowrankFloat32;
  // The 16-bit part (transport/wire.h) of the allreduce of the slice [from, from + len) of a
  // payload whose factors are its elements [lo, hi): the slice's factors, in the slice's own
  // indices (float32 factors: none). Both host schedules post every factor allreduce with it.
  Wire factorWire(size_t from, size_t len, size_t lo, size_t hi) const {
    const size_t a = std::max(lo, from), b = std::min(hi, from + len);
    return b > a ? Wire{factorDtype, a - from, b - from} : Wire{};
  }

  bool pipelined = false;
  std::vector<RowBlock> rowBlocks;
  std::vector<ColBlock> colBlocks;
  std::vector<Chunk> pChunks, qChunks;  // the last P chunk also carries the two check elements
};

// A block of a chunk resolved against its tensor, for the host schedule and the device's alike (the
// one place block offsets are computed): the elements of M it covers and where its factors sit.
// Row block (P chunks): rows [first, first + rows) of the tensor's view, every column; its P rows
// at p (row stride k) in the P area, the tensor's whole Qt at qt (row stride qld = cols).
// Column block (Q chunks): every row, columns [first, first + cols); the tensor's whole P at p,
// the block's Qt (k x cols) at qt in the Q wire (row stride qld = cols).
struct BlockSpan {
  size_t tensor = 0;
  size_t first = 0;    // its first row (row block) or column (column block) in the tensor's view
  size_t offset = 0;   // element (0, 0) of the block in the buffer (G, E, output)
  size_t valid = 0;    // elements that exist counted from offset (fewer than rows * ld if padded)
  size_t ld = 0;       // row stride of the tensor's view
  size_t rows = 0, cols = 0;
  int k = 0;
  size_t p = 0, qt = 0, qld = 0;
  // The block as a host kernel's view (rows x cols, stride ld, `valid` elements).
  host::MatrixView view() const {
    host::MatrixView v;
    v.rows = rows;
    v.cols = cols;
    v.valid = valid;
    v.ld = ld;
    return v;
  }
};
BlockSpan rowSpan(const Plan& p, const RowBlock& b);
BlockSpan colSpan(const Plan& p, const ColBlock& b);

// The batched view of `count` elements: n x m with n * m = count, n <= m <= 4 n, n as large as
// possible; else a padded square of side ceil(sqrt(count)) (as PyTorch's batched hook).
host::MatrixView batchedView(size_t count);

// True if an n x m matrix at approximation rank k passes the compression test
// (n + m) k rate < n m, as PyTorch's powerSGD_hook.
bool shouldCompress(size_t n, size_t m, int k, double rate);

// Splits every compressed tensor of p into row blocks (P) and column blocks (Q) of at most `target`
// elements of M, grouped in chunks of about `target` elements. makePlan chunks every plan with
// compressed tensors: by EngineConfig::pipelineChunk when it pipelines, else in one chunk per
// phase (the schedule without overlap). Requires p.compressedElems > 0 and no chunks yet.
void makeChunks(Plan& p, size_t target);

// The agreement of a buffer's first call, shared by the host and device engines: every comm rank
// puts kWords words into one max-allreduce of uint64: its plan's hash and the hash's complement
// (the maxima equal both only if every rank has the same hash), 1 if it could not allocate the
// buffer's state, and likewise the id of the state it restored and its complement (0 and all ones:
// nothing restored; engine/checkpoint.h agreementId), so that a restore on some comm ranks only,
// or from different steps, is found on every rank. A rank whose planning failed (a layout that
// does not add up to count, a restore that does not fit) still takes part, so that its peers do
// not hang, with all ones in the hash words: every peer then finds the disagreement and fails the
// call too, so that no rank goes on to a collective the others do not make.
struct PlanCheck {
  static constexpr uint64_t kPlanFailed = ~uint64_t(0);
  static constexpr int kWords = LOWRANK_PLAN_CHECK_WORDS;
  uint64_t words[kWords];
  // Word 2: 0 allocated, 1 lowrank's own allocation failed (exact-only), 2 the supplied
  // allocator refused (the call fails on every rank): the maximum wins.
  PlanCheck(const Status& planned, const Plan& p, bool allocated, uint64_t restored,
            bool refused = false)
      : words{planned.ok() ? p.hash : kPlanFailed, planned.ok() ? ~p.hash : kPlanFailed,
              !planned.ok() ? 0u : refused ? 2u : !allocated ? 1u : 0u, restored, ~restored} {}
  // After the allreduce: lowrankInvalidUsage naming the buffer if the ranks' plans or restores
  // differ; lowrankSystemError (agreed) if some comm rank's supplied allocator refused; else Ok,
  // with *exactOnly set (and a warning logged) when some comm rank could not allocate.
  // restored: this rank's id, as given to the constructor; calls: its restored calls.
  Status read(const Plan& p, lowrankRedOp_t op, const void* buf, bool allocated, uint64_t restored,
              uint64_t calls, bool* exactOnly, bool refused = false) const;
};

// Folds v into the hash h: the hashes the comm ranks compare (the plan's, a restored state's).
uint64_t mix(uint64_t h, uint64_t v);

// Fills view (lowrankBufferGetView) from a plan and the calls made since it was made.
void describePlan(const Plan& p, uint64_t calls, lowrankBufferView_t* view);

// The k a declared treatment asks for (LOWRANK_RANK_DEFAULT: the communicator's; 0: exact),
// before the compression test and the clipping to min(n, m). Two declarations of a tensor change
// its rank (lowrankStats_t.rankChanges) when these differ.
int declaredRank(int approxRank, const EngineConfig& cfg);

// Makes the plan. layout may be null (batched mode: one tensor). ids (may be null: the defaults):
// each tensor's id and rank in force (its own, the default, or 0 for exact; the caller puts 0 for
// a tensor still in its warm-up), all of which the hash covers. Errors: lowrankInvalidUsage when
// the layout's elements do not add up to count.
Status makePlan(size_t count, lowrankDataType_t dtype, lowrankRedOp_t op, const Layout* layout,
                const EngineConfig& cfg, Plan* plan, const TensorIds* ids = nullptr);

}  // namespace lowrank
