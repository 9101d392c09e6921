// Where lowrank's UCX messages go eager rather than by UCX's rendezvous protocol.
//
// UCX 1.13 sends a message above its rendezvous threshold (RNDV_THRESH, "auto") by rendezvous: a
// request, then the data pulled by the receiver. Over TCP that costs a round trip and a slower data
// path per message: on 4 namespaced hosts at 100 Mbit/s (the honest wire, docs/benchmarks.md,
// "Eager messages over TCP") a 1 MiB exact allreduce as chosen took 291 ms, 199 ms with every
// message eager; halving + doubling, whose steps each send one message of up to 512 KiB, suffered
// most (1.30x the ring's time; 1.0x eager). Over TCP there is no zero copy to lose (the data passes
// through the socket either way), and lowrank's messages are at most the transport's chunk (1 MiB),
// every receive posted before its send. So where every network transport the context can use is
// TCP, lowrank sets RNDV_THRESH to inf (eager), unless the user set UCX_RNDV_THRESH: in the
// environment (any value, auto included), or to a value other than the default (auto) in a UCX
// configuration file. Where an RDMA transport may carry
// the data, rendezvous (zero copy) stays: lowrank cannot measure it here.
#pragma once
#include <string>

namespace lowrank::ucx {

// True when the context's data can only travel over TCP. tls: the UCX_TLS in force (the comm's
// override, else UCX's configuration; empty: unset). A list of transports without a negation ("^")
// and other than "all" is TCP-only when it names tcp and every other entry is self or a
// shared-memory one (sm, shm, mm, posix, sysv, cma, knem, xpmem: unused with peer-failure handling
// in UCX 1.13, so never the data path between processes here); otherwise it is TCP-only when the
// host has no RDMA device (rdmaDevices false: /sys/class/infiniband empty or absent).
bool tcpOnly(const std::string& tls, bool rdmaDevices);

// Whether the host has an RDMA device (an entry in /sys/class/infiniband).
bool hostHasRdmaDevice();

// The RNDV_THRESH lowrank sets on its UCX context: "inf" where tcpOnly and userRndv (the user's
// UCX_RNDV_THRESH, as above) is null or empty, else null (UCX's own setting stands).
const char* rendezvousThreshold(const char* userRndv, const std::string& tls, bool rdmaDevices);

}  // namespace lowrank::ucx
