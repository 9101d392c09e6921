// The host transport over UCX (ucp tag API): one UCX context and worker per comm rank, endpoints
// to every peer (exchanged through the bootstrap), error handling mode PEER so that a dead peer is
// reported rather than waited for. Large buffers use a chunked ring (reduce-scatter + allgather,
// each rank sends 2(N-1)/N of the buffer); small ones a one-step direct exchange reduced locally
// in comm-rank order (latency-friendly). Both give the same bits on every rank.
#pragma once
#include <memory>

#include "transport/transport.h"

namespace lowrank {

// Collective: every comm rank of `id` calls it. timeoutSec bounds every later wait.
Status createUcxTransport(const lowrankUniqueId& id, int rank, int nranks, double timeoutSec,
                          std::unique_ptr<Transport>* out);

}  // namespace lowrank
