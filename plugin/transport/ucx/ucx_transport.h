// The host transport over UCX (ucp tag API): one UCX context and worker per comm rank, endpoints
// to every peer (exchanged through the bootstrap), error handling mode PEER so that a dead peer is
// reported rather than waited for. Each call runs the algorithm the cost model (cost_model.h,
// choose(): the fewest bytes among the nearly cheapest) picks for its size and world (or, with
// tune, the one its size class's first calls measured fastest, agreed by every rank: tuner.h): a
// chunked ring, Rabenseifner's halving + doubling, recursive doubling or a one-step direct
// exchange. All give the same bits on every rank.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "transport/transport.h"
#include "transport/ucx/cost_model.h"
#include "transport/ucx/link_probe.h"
#include "transport/ucx/tuner.h"

namespace lowrank {

// Collective: every comm rank of `id` calls it. timeoutSec bounds every later wait.
Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          std::unique_ptr<Transport>* out);

// Tuning of the UCX transport (the defaults are what createUcxTransport above uses). Every comm rank
// must use the same values (they choose the algorithm and the message layout).
struct UcxTransportOptions {
  ucx::CostParams cost;                      // alpha, beta, o of the choice (see probe)
  // Measure the links when the transport is made (link_probe.h) and choose with what every comm
  // rank agreed, except the constants pinned below (kept from `cost`). Only where the cost model
  // chooses: not with `algorithm` nor `tune`. Off: `cost` as given, nothing measured (the choice
  // then never depends on timing: bit-exact tests and thread-mode communicators).
  bool probe = false;
  bool alphaPinned = false, betaPinned = false, overheadPinned = false;
  ucx::ProbeOptions probeOptions;
  std::function<void(ucx::ProbeTimings*)> probeAdjust;  // tests: this rank's timings, changed
  std::function<void(const ucx::ProbeResult&)> onProbed;  // tests: called once it is agreed
  std::optional<ucx::Algorithm> algorithm;  // set: every call runs it (LOWRANK_UCX_ALGO); wins over tune
  // LOWRANK_UCX_ALGO=tune: the first calls of each size class time the candidates, the comm ranks
  // agree on the timings and freeze the fastest (tuner.h). Off: the cost model chooses.
  bool tune = false;
  int tuneRepeats = 3;  // trials per candidate and size class (>= 1)
  // The seconds recorded for a trial of `algo` that took measuredSec (default: measuredSec). A
  // test feeds each rank its own timings through it.
  std::function<double(ucx::Algorithm algo, double measuredSec)> tuneTimer;
  // Called on the calling thread at each size class's freeze (tests; studies that store the choice).
  std::function<void(const ucx::TuneResult&)> onTuned;
  int directMaxRanks = 64;  // the model may choose direct only up to here (its scratch is N buffers)
  size_t chunkBytes = 1 << 20;  // ring, halving + doubling: largest message
  int inflight = 4;             // ring, halving + doubling: chunks moving at once (ring's scratch =
                                // inflight * chunkBytes)
  std::string tls;              // if not empty, UCX_TLS for this comm rank's context
};

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          const UcxTransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace lowrank
