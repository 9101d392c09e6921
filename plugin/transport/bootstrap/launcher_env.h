// The bootstrap of lowrankCommInitFromEnv: comm rank and size, the root's address and the secret,
// read from the environment that a launcher (torchrun, mpirun, srun, or a user by hand) sets, and
// the unique id built from them without any side channel: every process computes the same id, and
// comm rank 0 serves it on the root's fixed port.
#pragma once
#include <netinet/in.h>

#include <string>

#include "lowrank/lowrank.h"
#include "transport/bootstrap/wire.h"
#include "util/status.h"

namespace lowrank::bootstrap {

struct LauncherEnv {
  int rank = -1, size = 0;
  std::string rankVar, sizeVar;  // the variables the comm rank and size came from
  std::string rootHost;          // as written in the variable (hostname or IPv4)
  uint16_t rootPort = 0;
  std::string rootSource;        // "LOWRANK_ROOT_ADDR" or "MASTER_ADDR/MASTER_PORT+1"
  bool secretGiven = false;      // LOWRANK_SECRET was set (else the secret is derived)
  RootInfo root;                 // resolved address (network order) and the secret
};

// Reads the launcher variables (first pair found wins, see lowrank.h) and resolves the root's
// address. Errors: lowrankInvalidUsage naming the variable (none found, malformed, rank >= size,
// unresolvable host), lowrankSystemError (resolver failure other than an unknown name).
Status readLauncherEnv(LauncherEnv* out);

// The secret derived when LOWRANK_SECRET is not set: a hash of "host:port" (as written) and the
// world size. Deterministic, so every process derives the same; it keeps stray processes of
// another job out, it is no protection against a hostile network.
void deriveSecret(const std::string& host, uint16_t port, int size, uint8_t* secret);

// The unique id of env.root; on comm rank 0, also binds the root's port and starts the server
// thread (on the root address when it is an address of this host, else on LOWRANK_SOCKET_IFNAME's
// interface, else on 0.0.0.0). Errors: lowrankSystemError (bind: port in use), lowrankInvalidUsage
// (unknown LOWRANK_SOCKET_IFNAME).
Status uniqueIdFromLauncherEnv(const LauncherEnv& env, double timeoutSec, lowrankUniqueId* id);

// Implemented in unique_id.cc.
// Serves the communicator of `root` (the address every comm rank connects to, and the secret) on a
// listening socket bound to bindAddr (port included, SO_REUSEADDR) from a server thread, as
// makeUniqueId does. Errors: lowrankSystemError naming the address (port in use, not local).
Status serveRootAt(const RootInfo& root, const sockaddr_in& bindAddr, double timeoutSec);
// The IPv4 address of LOWRANK_SOCKET_IFNAME's interface, else of the first non-loopback interface
// that is up, else 127.0.0.1 (what makeUniqueId listens on).
Status socketInterfaceAddress(in_addr* addr, std::string* ifname);

}  // namespace lowrank::bootstrap
