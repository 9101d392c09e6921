// The host transport over UCX (ucp tag API): one UCX context and worker per comm rank, endpoints
// to every peer (exchanged through the bootstrap), error handling mode PEER so that a dead peer is
// reported rather than waited for. Large buffers use a chunked ring (reduce-scatter + allgather,
// each rank sends 2(N-1)/N of the buffer); small ones a one-step direct exchange reduced locally
// in comm-rank order (latency-friendly). Both give the same bits on every rank.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace lowrank {

// Collective: every comm rank of `id` calls it. timeoutSec bounds every later wait.
Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          std::unique_ptr<Transport>* out);

// Tuning of the UCX transport (the defaults are what createUcxTransport above uses). Every comm rank
// must use the same values (they choose the algorithm and the message layout).
struct UcxTransportOptions {
  // The direct algorithm serves a call when it sends at most directMaxBytes per rank,
  // count * elemSize * (N - 1), and the comm has at most directMaxRanks ranks (its scratch is
  // N * bytes); the ring serves every other call.
  size_t directMaxBytes = 32 * 1024;
  int directMaxRanks = 64;
  size_t chunkBytes = 1 << 20;  // ring: largest message
  int inflight = 4;             // ring: chunks moving at once (scratch = inflight * chunkBytes)
  std::string tls;              // if not empty, UCX_TLS for this comm rank's context
};

Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          const UcxTransportOptions& options, std::unique_ptr<Transport>* out);

}  // namespace lowrank
