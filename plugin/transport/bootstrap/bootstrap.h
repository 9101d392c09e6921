// Rendezvous of the comm ranks of a new communicator over TCP, as NCCL's bootstrap: the root's
// lowrankGetUniqueId opens a listening socket and serves one communicator from a background thread;
// each comm rank connects, presents the id's secret and its blob (e.g. a UCX worker address), and
// receives every rank's blob. A peer without the secret, or sending a malformed or oversized message,
// is refused and does not disturb the others.
#pragma once
#include <string>
#include <vector>

#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank::bootstrap {

// Fills *id with the root's address and a random 128-bit secret, and starts serving it.
// The server thread exits once a communicator has formed, or after `timeoutSec` of waiting.
Status makeUniqueId(lowrankUniqueId* id, double timeoutSec);

// Collective over the nranks comm ranks of `id`: returns, indexed by comm rank, every rank's blob.
// Errors: lowrankInvalidArgument (malformed id), lowrankRemoteError (refused, mismatched nranks,
// duplicate rank), lowrankTimeout, lowrankSystemError.
Status allgatherBlobs(const lowrankUniqueId& id, int rank, int nranks, const std::string& blob,
                      double timeoutSec, std::vector<std::string>* all);

}  // namespace lowrank::bootstrap
