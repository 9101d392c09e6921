// The root's rendezvous server: one detached thread per unique id (see wire.h for the protocol).
#pragma once
#include "transport/bootstrap/socket.h"
#include "transport/bootstrap/wire.h"
#include "util/status.h"

namespace lowrank::bootstrap {

// Serves one communicator on the listening socket `listenFd` (non-blocking) from a detached thread:
// collects a valid hello from each of the nranks comm ranks, then sends everyone the blob table and
// exits. Refused peers (bad magic/secret/lengths, early close) are dropped without disturbing the
// others. A nranks mismatch or a duplicate rank fails every connected rank with
// lowrankRemoteError; after timeoutSec the connected ranks get lowrankTimeout. Either way the thread
// then exits and closes the socket.
Status startServer(Fd listenFd, const RootInfo& info, double timeoutSec);

}  // namespace lowrank::bootstrap
