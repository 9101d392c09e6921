#include "transport/ucx/eager.h"

#include <filesystem>
#include <sstream>
#include <system_error>

namespace lowrank::ucx {

bool tcpOnly(const std::string& tls, bool rdmaDevices) {
  if (tls.empty() || tls == "all" || tls[0] == '^') return !rdmaDevices;
  std::stringstream ss(tls);
  bool tcp = false;
  for (std::string t; std::getline(ss, t, ',');) {
    static const char* const kLocal[] = {"self", "sm",   "shm",  "mm",   "posix",
                                         "sysv", "cma",  "knem", "xpmem"};
    bool known = t == "tcp";
    tcp = tcp || known;
    for (const char* k : kLocal) known = known || t == k;
    if (!known) return false;  // rc, ud, dc, ib, cuda_ipc, ...: maybe not TCP
  }
  return tcp;  // without tcp no network transport is left (the communicator fails to connect)
}

bool hostHasRdmaDevice() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

const char* rendezvousThreshold(const char* userRndv, const std::string& tls, bool rdmaDevices) {
  if (userRndv && *userRndv) return nullptr;
  return tcpOnly(tls, rdmaDevices) ? "inf" : nullptr;
}

}  // namespace lowrank::ucx
