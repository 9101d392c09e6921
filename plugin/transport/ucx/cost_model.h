// The cost model of the host transport's allreduce algorithms, the one place their steps, messages
// and bytes are stated: modelled time = steps * alpha + extra messages * o + bytes sent by the
// busiest comm rank * beta (Hockney's model, as MPICH and Open MPI's tuned collectives use, with
// LogP's per-message overhead o for the messages a step handles beyond one send and one receive).
// Pure functions, no UCX: the transport chooses with them, the tests hold
// lowrankStats_t.bytesSent to them, and perf/ prints the tables.
//
// Worlds that are not a power of two (N = p + r, p the largest power of two <= N) fold first: the
// r even comm ranks below 2r send their buffer to the next odd rank, the p remaining ranks run
// the algorithm, and each odd partner sends the result back at the end (2 more steps, one more
// buffer for the partners).
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/ucx/blocks.h"
#include "transport/wire.h"

namespace lowrank::ucx {

// In the order of preference among equally cheap algorithms (the ring first: its chunks pipeline
// through all its steps, while halving + doubling's chunks pipeline within a step and drain at its
// end; the model credits neither).
enum class Algorithm { Ring, HalvingDoubling, RecursiveDoubling, Direct };
inline constexpr int kNumAlgorithms = 4;

// Their names (LOWRANK_UCX_ALGO, logs, tables), in enum order.
inline constexpr const char* kAlgorithmNames[kNumAlgorithms] = {"ring", "halving_doubling",
                                                                "recursive_doubling", "direct"};
inline const char* algorithmName(Algorithm a) { return kAlgorithmNames[int(a)]; }

struct CostParams {
  // What a communicator uses when its links are not measured (link_probe.h measures them when it
  // is made, unless pinned): 5 us per step (a hop of a small message over UCX/TCP between hosts),
  // 100 Gbit/s (0.08 ns per byte) and no per-message overhead. LOWRANK_UCX_ALPHA_US,
  // LOWRANK_UCX_BETA_NS and LOWRANK_UCX_OVERHEAD_US pin them.
  double alphaSec = 5e-6;
  double betaSecPerByte = 0.08e-9;
  double overheadSec = 0;  // LogP's o: the CPU time of one more message sent and received
};

// foldedWorld(n) and log2Floor(n), the fold's p and log2(p): blocks.h, shared with the algorithms.

// Sequential message rounds of one allreduce over n comm ranks (n >= 2).
int steps(Algorithm a, int n);

// Messages a comm rank sends and receives in one allreduce beyond one of each per step: direct
// handles n-1 of each in its one step, 2(n-2) more; the others one of each per step (their chunks,
// in flight together, are charged through bytes), 0.
int extraMessages(Algorithm a, int n);

// Bytes comm rank `rank` of n sends in one allreduce of count elements of elemSize bytes, exactly
// as the algorithm splits the buffer (the ring and the halving: balanced blocks of the count,
// sizes differing by at most one element). lowrankStats_t.bytesSent grows by this much.
uint64_t bytesSent(Algorithm a, int n, int rank, size_t count, size_t elemSize);

// Bytes of the busiest comm rank, nominal (ignoring the one-element rounding of blocks): what the
// time model charges. Direct (n-1)B; ring 2(n-1)/n B; recursive doubling log2(p) B (+B if n != p);
// halving + doubling 2(p-1)/p B (+B if n != p).
double busiestBytes(Algorithm a, int n, double bytes);

double modelledSeconds(Algorithm a, int n, double bytes, const CostParams& c);

// True if the algorithm rounds each element of a 16-bit part (wire.h) a number of times that does
// not grow faster than log2(n): every one but the ring, whose reduce-scatter rounds each partial sum
// at each of its n-1 hops (docs/design.md, "16-bit factors", measured).
inline bool roundsBounded(Algorithm a, int n) { return a != Algorithm::Ring || n <= 2; }

// Modelled times within this fraction of the fastest are not told apart: the constants a
// communicator measures when it is made vary by 10-20% from run to run (docs/benchmarks.md, §4), and
// two algorithms that close swapped places between runs of the same setting (16 hosts, 64 KiB).
inline constexpr double kNearMargin = 0.2;

// The algorithm for an allreduce of `bytes` over n comm ranks: of those modelled within kNearMargin
// of the fastest, the one whose busiest comm rank sends the fewest bytes (it leaves the link to
// other traffic, and the choice flips only when the measured constants move the two more than the
// margin apart), then the faster, then the earlier of the enum. Direct only while n <=
// directMaxRanks (its scratch holds n buffers); with wire16 (a 16-bit part), only those that
// roundsBounded.
Algorithm choose(int n, double bytes, const CostParams& c, int directMaxRanks, bool wire16 = false);

// Bytes comm rank `rank` of n sends in one allreduce of count float32 elements with the 16-bit part
// `wire` (wire.h): bytesSent(a, n, rank, count, 4) less 2 bytes per element of the part it sends.
uint64_t bytesSent(Algorithm a, int n, int rank, size_t count, const Wire& wire);

}  // namespace lowrank::ucx
