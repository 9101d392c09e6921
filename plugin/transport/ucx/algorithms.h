// The allreduce algorithms of the UCX transport, over one Exchange (one collective's messages).
// Each leaves the same bits on every comm rank. Their steps and bytes: cost_model.h, which chooses.
#pragma once
#include <cstddef>
#include <vector>

#include "lowrank/lowrank.h"
#include "transport/ucx/ucx_comm.h"
#include "transport/wire.h"
#include "util/status.h"

namespace lowrank::ucx {

struct AllreduceArgs {
  void* buf;
  size_t count;
  lowrankDataType_t dtype;
  lowrankRedOp_t op;
  size_t elemSize;
  Wire wire;  // a 16-bit part (wire.h), set up on the Exchange by the transport; float32 only
};

// Direct (small buffers): every rank sends its whole buffer to every peer, then reduces the N
// contributions locally in comm-rank order 0..N-1 (so every rank computes the same bits).
// Sends (N-1) * count elements per rank in one round. scratch grows to N * count * elemSize bytes.
Status directAllreduce(Exchange& ex, const AllreduceArgs& a, std::vector<std::byte>* scratch);

// Ring (large buffers): reduce-scatter then allgather over N balanced segments (sizes differ by at
// most one element), each segment split into chunks of <= chunkBytes; up to `inflight` chunks move
// through the 2(N-1) steps at once, each independently (a chunk's step s+1 starts as soon as its
// step s has completed), so steps pipeline. Each segment is reduced along one chain of ranks and then
// copied, so every rank ends with the same bits. Sends 2(N-1)/N of the buffer per rank; over all
// ranks exactly 2(N-1) * count elements. scratch grows to inflight * chunkBytes.
Status ringAllreduce(Exchange& ex, const AllreduceArgs& a, size_t chunkBytes, int inflight,
                     std::vector<std::byte>* scratch);

// Recursive doubling (latency-bound buffers): log2(p) steps, each swapping the whole buffer with
// the partner at distance 1, 2, 4, .. and combining the two in the lower comm rank's order; worlds
// that are not a power of two fold first (blocks.h). scratch grows to count * elemSize bytes.
Status recursiveDoublingAllreduce(Exchange& ex, const AllreduceArgs& a, std::vector<std::byte>* scratch);

// Rabenseifner's halving + doubling (medium buffers): a reduce-scatter by recursive halving over p
// balanced blocks, then an allgather by recursive doubling; 2 log2(p) steps, about 2 (p-1)/p of the
// buffer sent per rank; the same fold. Each step's exchange moves in chunks of <= chunkBytes, up to
// `inflight` at once both ways, and a received chunk is reduced while the next ones travel (as the
// ring's do); the chunking changes no result bit. scratch grows to count * elemSize bytes.
Status halvingDoublingAllreduce(Exchange& ex, const AllreduceArgs& a, size_t chunkBytes, int inflight,
                                std::vector<std::byte>* scratch);

}  // namespace lowrank::ucx
