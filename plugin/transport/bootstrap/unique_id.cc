// makeUniqueId: choose the interface, open the listening socket, draw the secret, start the server.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/launcher_env.h"
#include "transport/bootstrap/server.h"
#include "transport/bootstrap/socket.h"
#include "transport/bootstrap/wire.h"
#include "util/env.h"
#include "util/log.h"

namespace lowrank::bootstrap {

void encodeUniqueId(const RootInfo& info, lowrankUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  auto* p = reinterpret_cast<uint8_t*>(id->internal);
  putU64(p, kIdMagic);
  putU32(p + 8, kIdVersion);
  std::memcpy(p + 16, &info.addr, sizeof info.addr);
  std::memcpy(p + 32, info.secret, kSecretBytes);
}

Status decodeUniqueId(const lowrankUniqueId& id, RootInfo* info) {
  static_assert(sizeof(sockaddr_in) == 16 && 48 <= LOWRANK_UNIQUE_ID_BYTES);
  auto* p = reinterpret_cast<const uint8_t*>(id.internal);
  if (getU64(p) != kIdMagic)
    return Status::Error(lowrankInvalidArgument, "unique id: bad magic (not made by lowrankGetUniqueId?)");
  if (getU32(p + 8) != kIdVersion)
    return Status::Error(lowrankInvalidArgument, "unique id: version %u, this library reads %u",
                         getU32(p + 8), kIdVersion);
  std::memcpy(&info->addr, p + 16, sizeof info->addr);
  if (info->addr.sin_family != AF_INET || info->addr.sin_port == 0)
    return Status::Error(lowrankInvalidArgument, "unique id: malformed root address");
  std::memcpy(info->secret, p + 32, kSecretBytes);
  return Status::Ok();
}

bool secretEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t d = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) d |= uint8_t(a[i] ^ b[i]);
  return d == 0;
}

// The address to listen on: LOWRANK_SOCKET_IFNAME's interface, else the first non-loopback IPv4
// interface that is up, else 127.0.0.1.
static Status chooseAddress(in_addr* out, std::string* ifname) {
  const char* want = env::get("LOWRANK_SOCKET_IFNAME");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return Status::Error(lowrankSystemError, "bootstrap: getifaddrs: %s", strerror(errno));
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    if (want ? std::strcmp(a->ifa_name, want) != 0 : (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    *out = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr;
    *ifname = a->ifa_name;
    found = true;
  }
  freeifaddrs(list);
  if (found) return Status::Ok();
  if (want)
    return Status::Error(lowrankInvalidUsage,
                         "LOWRANK_SOCKET_IFNAME=%s: no interface of that name is up with an IPv4 "
                         "address", want);
  out->s_addr = htonl(INADDR_LOOPBACK);
  *ifname = "lo";
  return Status::Ok();
}

static Status randomSecret(uint8_t* s) {
  size_t got = 0;
  while (got < kSecretBytes) {
    ssize_t r = getrandom(s + got, kSecretBytes - got, 0);
    if (r > 0) got += size_t(r);
    else if (r < 0 && errno != EINTR) break;
  }
  if (got == kSecretBytes) return Status::Ok();
  Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  got = 0;
  while (fd.valid() && got < kSecretBytes) {
    ssize_t r = ::read(fd.get(), s + got, kSecretBytes - got);
    if (r > 0) got += size_t(r);
    else if (r == 0 || errno != EINTR) break;
  }
  if (got == kSecretBytes) return Status::Ok();
  return Status::Error(lowrankSystemError, "bootstrap: no random source (getrandom, /dev/urandom)");
}

// Opens a listening socket bound to *addr (port 0: any); on success *addr is the bound address.
// `reuse` sets SO_REUSEADDR (a fixed port must be reusable while old connections are in TIME_WAIT;
// a port someone listens on still fails with EADDRINUSE).
static Status listenOn(sockaddr_in* addr, const std::string& what, bool reuse, Fd* out) {
  Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (!fd.valid() || !setNonBlocking(fd.get()))
    return Status::Error(lowrankSystemError, "bootstrap: socket: %s", strerror(errno));
  int one = 1;
  if (reuse && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return Status::Error(lowrankSystemError, "bootstrap: SO_REUSEADDR: %s", strerror(errno));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(addr), sizeof *addr) != 0) {
    int e = errno;
    return Status::Error(lowrankSystemError, "bootstrap: bind %s (%s): %s%s",
                         addrString(*addr).c_str(), what.c_str(), strerror(e),
                         e == EADDRINUSE ? " (another process listens on this port: pick another "
                                           "one, or wait for the previous run to end)" : "");
  }
  if (::listen(fd.get(), SOMAXCONN) != 0)
    return Status::Error(lowrankSystemError, "bootstrap: listen on %s: %s",
                         addrString(*addr).c_str(), strerror(errno));
  socklen_t len = sizeof *addr;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(addr), &len) != 0)
    return Status::Error(lowrankSystemError, "bootstrap: getsockname: %s", strerror(errno));
  *out = std::move(fd);
  return Status::Ok();
}

Status makeUniqueId(lowrankUniqueId* id, double timeoutSec) {
  if (!id) return Status::Error(lowrankInvalidArgument, "makeUniqueId: null id");
  if (!(timeoutSec > 0))
    return Status::Error(lowrankInvalidArgument, "makeUniqueId: timeout %g s, must be > 0", timeoutSec);
  RootInfo info;
  std::string ifname;
  LR_RETURN_IF_ERROR(chooseAddress(&info.addr.sin_addr, &ifname));
  LR_RETURN_IF_ERROR(randomSecret(info.secret));
  info.addr.sin_family = AF_INET;
  info.addr.sin_port = 0;

  Fd fd;
  LR_RETURN_IF_ERROR(listenOn(&info.addr, ifname, false, &fd));
  LR_INFO("bootstrap: root listening on %s (%s)", addrString(info.addr).c_str(), ifname.c_str());

  encodeUniqueId(info, id);
  return startServer(std::move(fd), info, timeoutSec);
}

Status socketInterfaceAddress(in_addr* addr, std::string* ifname) {
  return chooseAddress(addr, ifname);
}

Status serveRootAt(const RootInfo& root, const sockaddr_in& bindAddr, double timeoutSec) {
  if (!(timeoutSec > 0))
    return Status::Error(lowrankInvalidArgument, "serveRootAt: timeout %g s, must be > 0", timeoutSec);
  if (bindAddr.sin_family != AF_INET || bindAddr.sin_port == 0)
    return Status::Error(lowrankInvalidArgument, "serveRootAt: the bind address needs a port");
  sockaddr_in addr = bindAddr;
  Fd fd;
  LR_RETURN_IF_ERROR(listenOn(&addr, "root address " + addrString(root.addr), true, &fd));
  LR_INFO("bootstrap: root listening on %s (comm ranks connect to %s)", addrString(addr).c_str(),
          addrString(root.addr).c_str());
  return startServer(std::move(fd), root, timeoutSec);
}

}  // namespace lowrank::bootstrap
