// The links measured when a communicator is made (issue 40), so that the cost model (cost_model.h)
// chooses from the network it runs on, not from guessed constants: the lower comm rank of each
// pair (2i, 2i+1) times, with its partner, a ping-pong of a small message, a burst of small messages
// answered once, and two large messages answered once, every pair at once (as a collective loads
// the machine and the links); then the small ping-pong again, one pair at a time (after a barrier,
// a token passed from initiator to initiator; the others asleep). The fit gives
//   alpha = the small round trip alone / 2                 (one hop: latency and both overheads)
//   o     = (burst - small round trip) / (burst count - 1) (LogP's per-message overhead or gap,
//                                                           with every pair at once)
//   beta  = (large2 - large1) / (large2 bytes - large1 bytes)  (two sizes: UCX's rendezvous and any
//                                                           per-message cost cancel)
// from the minimum of each over the repeats (the least disturbed; MPI tuners use it too). Then
// every comm rank takes the max over comm ranks of each (an allreduce with one fixed algorithm),
// so all choose alike from the slowest link measured; a rank without a partner (the last of an
// odd world) contributes nothing.
// Why alpha alone and o together: where the processes outnumber the cores (16 hosts on 2 here),
// the round trip with every pair at once is the scheduler's (alpha 2-3x the calibrated link's,
// which made the model buy rounds with bytes), while the CPU a message costs is what every rank
// sending at once leaves (with o from one pair alone, 58 us against 110-990 us, direct looked
// cheapest for 256 B - 1 KiB at 16 hosts and measured 1.5x recursive doubling's time).
//
// Costs: repeats x (the two large messages + 4 round trips), the pairs in parallel; then a barrier
// and, one pair after the other, repeats small round trips and one hop of the token: at 1 ms one
// way, 100 Mbit/s, about 0.1 s + 7 ms per pair (0.16 s at 16 hosts).
// Thread safety: the transport's calling thread, collectively (every comm rank, in step).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "transport/ucx/cost_model.h"
#include "transport/ucx/ucx_comm.h"
#include "util/status.h"

namespace lowrank::ucx {

struct ProbeOptions {
  size_t smallBytes = 8;
  int burst = 8;                      // small messages of the burst (>= 2)
  size_t large1Bytes = size_t(64) << 10;
  size_t large2Bytes = size_t(256) << 10;
  int repeats = 3;                    // >= 1
};

// What one comm rank measured (seconds, its minimum over the repeats; 0 without a partner).
struct ProbeTimings {
  double smallRtt = 0, burst = 0, large1 = 0, large2 = 0;  // every pair at once
  double smallRttAlone = 0;  // one pair at a time; 0: not measured (the fit takes smallRtt)
};

// The fit above of one rank's timings; all zero for zero timings (no partner).
CostParams fitLink(const ProbeTimings& t, const ProbeOptions& o);

struct ProbeResult {
  int partner = -1;      // -1: none
  ProbeTimings timings;  // this comm rank's
  CostParams local;      // fitLink(timings)
  CostParams agreed;     // the max over comm ranks of each constant
  double seconds = 0;    // the probe's own wall time here
  // When this rank's round trips alone began and ended (steady clock, seconds): one pair's
  // window never overlaps another's.
  double smallBegin = 0, smallEnd = 0;
};

// Collective over comm's ranks; *seq is the transport's sequence number (each exchange takes the
// next). adjust, if set, changes this rank's timings before the fit (tests feed ranks different
// ones). Errors: as the exchanges' (a dead peer, the timeout).
Status probeLinks(UcxComm& comm, uint32_t* seq, const ProbeOptions& opt,
                  const std::function<void(ProbeTimings*)>& adjust, ProbeResult* out);

}  // namespace lowrank::ucx
