// lowrankCommInitFromEnv's bootstrap: launcher variables -> comm rank/size, root address, secret,
// unique id; comm rank 0 serves the id on the root's fixed port.
#include "transport/bootstrap/launcher_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/bootstrap/socket.h"
#include "util/env.h"
#include "util/log.h"

namespace lowrank::bootstrap {
namespace {

// A decimal integer in [lo, hi], the whole string (surrounding blanks are not accepted).
bool parseInt(const char* v, long lo, long hi, long* out) {
  if (!v || !*v) return false;
  char* end;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || *end || end == v || x < lo || x > hi || *v == ' ' || *v == '+') return false;
  *out = x;
  return true;
}

struct Pair {
  const char* rank;
  const char* size;
};
constexpr Pair kPairs[] = {
    {"LOWRANK_RANK", "LOWRANK_WORLD_SIZE"},
    {"RANK", "WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI_RANK", "PMI_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};

Status readRankSize(LauncherEnv* out) {
  std::string partial;  // launcher pairs of which only one variable is set: skipped, reported
  for (const Pair& p : kPairs) {
    const char* r = env::get(p.rank);
    const char* s = env::get(p.size);
    if (!r && !s) continue;
    bool explicitPair = std::strncmp(p.rank, "LOWRANK_", 8) == 0;
    if (!r || !s) {
      const char* set = r ? p.rank : p.size;
      const char* unset = r ? p.size : p.rank;
      if (explicitPair)
        return Status::Error(lowrankInvalidUsage, "environment variable %s is set but %s is not "
                             "(set both, or neither)", set, unset);
      LR_INFO("bootstrap: %s is set without %s: pair skipped", set, unset);
      partial += std::string(partial.empty() ? "" : ", ") + set + " without " + unset;
      continue;
    }
    long size, rank;
    if (!parseInt(s, 1, long(kMaxRanks), &size))
      return Status::Error(lowrankInvalidUsage, "environment variable %s=\"%s\" is not an integer "
                           "in [1, %u] (the number of comm ranks)", p.size, s, kMaxRanks);
    if (!parseInt(r, 0, long(kMaxRanks), &rank))
      return Status::Error(lowrankInvalidUsage, "environment variable %s=\"%s\" is not a "
                           "non-negative integer (this process's comm rank)", p.rank, r);
    if (rank >= size)
      return Status::Error(lowrankInvalidUsage, "environment variable %s=%ld is not below %s=%ld",
                           p.rank, rank, p.size, size);
    out->rank = int(rank);
    out->size = int(size);
    out->rankVar = p.rank;
    out->sizeVar = p.size;
    return Status::Ok();
  }
  std::string looked;
  for (const Pair& p : kPairs) looked += std::string(looked.empty() ? "" : ", ") + p.rank + "/" + p.size;
  return Status::Error(lowrankInvalidUsage, "lowrankCommInitFromEnv: no comm rank and size in the "
                       "environment; looked for %s%s%s (start the processes with torchrun, mpirun "
                       "or srun, or set LOWRANK_RANK and LOWRANK_WORLD_SIZE)", looked.c_str(),
                       partial.empty() ? "" : "; found only ", partial.c_str());
}

// host:port of the root's bootstrap server.
Status readRootAddress(LauncherEnv* out) {
  if (const char* v = env::get("LOWRANK_ROOT_ADDR")) {
    std::string s(v);
    size_t colon = s.rfind(':');
    long port;
    if (colon == std::string::npos || colon == 0 ||
        !parseInt(s.c_str() + colon + 1, 1, 65535, &port) ||
        s.find(':') != colon)
      return Status::Error(lowrankInvalidUsage, "environment variable LOWRANK_ROOT_ADDR=\"%s\" is "
                           "not host:port (a hostname or IPv4 address, and a port in [1, 65535])", v);
    out->rootHost = s.substr(0, colon);
    out->rootPort = uint16_t(port);
    out->rootSource = "LOWRANK_ROOT_ADDR";
    return Status::Ok();
  }
  const char* host = env::get("MASTER_ADDR");
  const char* portStr = env::get("MASTER_PORT");
  if (!host)
    return Status::Error(lowrankInvalidUsage, "lowrankCommInitFromEnv: no root address in the "
                         "environment: set LOWRANK_ROOT_ADDR=host:port, or MASTER_ADDR and "
                         "MASTER_PORT (as torchrun does; the root listens on MASTER_PORT + 1)");
  if (std::strchr(host, ':'))
    return Status::Error(lowrankInvalidUsage, "environment variable MASTER_ADDR=\"%s\" is not a "
                         "hostname or IPv4 address (IPv6 is not supported)", host);
  long port;
  if (!portStr)
    return Status::Error(lowrankInvalidUsage, "environment variable MASTER_ADDR is set but "
                         "MASTER_PORT is not (the root listens on MASTER_PORT + 1)");
  if (!parseInt(portStr, 1, 65534, &port))
    return Status::Error(lowrankInvalidUsage, "environment variable MASTER_PORT=\"%s\" is not an "
                         "integer in [1, 65534] (the root listens on MASTER_PORT + 1)", portStr);
  out->rootHost = host;
  out->rootPort = uint16_t(port + 1);
  out->rootSource = "MASTER_ADDR/MASTER_PORT+1";
  return Status::Ok();
}

Status resolve(const std::string& host, const char* var, in_addr* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    if (rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_NODATA || rc == EAI_ADDRFAMILY || rc == 0)
      return Status::Error(lowrankInvalidUsage, "environment variable %s: host \"%s\" has no IPv4 "
                           "address (%s)", var, host.c_str(), rc ? gai_strerror(rc) : "no result");
    return Status::Error(lowrankSystemError, "environment variable %s: cannot resolve \"%s\": %s",
                         var, host.c_str(), rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
  }
  *out = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return Status::Ok();
}

Status readSecret(LauncherEnv* out) {
  const char* v = env::get("LOWRANK_SECRET");
  if (!v) {
    deriveSecret(out->rootHost, out->rootPort, out->size, out->root.secret);
    out->secretGiven = false;
    return Status::Ok();
  }
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  size_t n = std::strlen(v);
  bool ok = n == 2 * kSecretBytes;
  for (size_t i = 0; ok && i < kSecretBytes; ++i) {
    int hi = hex(v[2 * i]), lo = hex(v[2 * i + 1]);
    ok = hi >= 0 && lo >= 0;
    if (ok) out->root.secret[i] = uint8_t(hi << 4 | lo);
  }
  // The value is a secret: the message gives its length, never its text.
  if (!ok)
    return Status::Error(lowrankInvalidUsage, "environment variable LOWRANK_SECRET (%zu characters) "
                         "is not 32 hexadecimal digits (e.g. the output of `openssl rand -hex 16`)", n);
  out->secretGiven = true;
  return Status::Ok();
}

bool isLoopback(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

// Whether `a` is an address of one of this host's interfaces (any 127/8 address is).
bool isLocalAddress(in_addr a) {
  if (isLoopback(a)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
      found = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == a.s_addr;
  freeifaddrs(list);
  return found;
}

bool isIpv4Literal(const std::string& host) {
  in_addr a;
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void deriveSecret(const std::string& host, uint16_t port, int size, uint8_t* secret) {
  std::string key = "lowrank-derived-secret-v1|" + host + ":" + std::to_string(port) + "|" +
                    std::to_string(size);
  uint64_t a = mix(fnv1a(key, 0xcbf29ce484222325ull));
  uint64_t b = mix(fnv1a(key, 0x84222325cbf29ce4ull) ^ a);
  putU64(secret, a);
  putU64(secret + 8, b);
}

Status readLauncherEnv(LauncherEnv* out) {
  LauncherEnv e;
  LR_RETURN_IF_ERROR(readRankSize(&e));
  LR_RETURN_IF_ERROR(readRootAddress(&e));
  const char* var = e.rootSource == "LOWRANK_ROOT_ADDR" ? "LOWRANK_ROOT_ADDR" : "MASTER_ADDR";
  LR_RETURN_IF_ERROR(resolve(e.rootHost, var, &e.root.addr.sin_addr));
  e.root.addr.sin_family = AF_INET;
  e.root.addr.sin_port = htons(e.rootPort);
  LR_RETURN_IF_ERROR(readSecret(&e));
  LR_INFO("bootstrap from the environment: comm rank %d of %d (%s/%s), root %s:%u = %s (%s), "
          "secret %s", e.rank, e.size, e.rankVar.c_str(), e.sizeVar.c_str(), e.rootHost.c_str(),
          unsigned(e.rootPort), addrString(e.root.addr).c_str(), e.rootSource.c_str(),
          e.secretGiven ? "from LOWRANK_SECRET" : "derived from the root address and world size");
  *out = std::move(e);
  return Status::Ok();
}

Status uniqueIdFromLauncherEnv(const LauncherEnv& env, double timeoutSec, lowrankUniqueId* id) {
  if (!id) return Status::Error(lowrankInvalidArgument, "uniqueIdFromLauncherEnv: null id");
  encodeUniqueId(env.root, id);
  if (env.rank != 0) return Status::Ok();

  // Comm rank 0 serves the id. On the root address itself when it is one of this host's (a
  // hostname that resolves to loopback here, as Debian's 127.0.1.1, may name another address on
  // the other hosts: listen on the interface instead); else on LOWRANK_SOCKET_IFNAME's interface;
  // else on every interface.
  sockaddr_in bind{};
  bind.sin_family = AF_INET;
  bind.sin_port = env.root.addr.sin_port;
  in_addr a = env.root.addr.sin_addr;
  const char* ifname = env::get("LOWRANK_SOCKET_IFNAME");
  std::string where;
  if (a.s_addr != htonl(INADDR_ANY) && isLocalAddress(a) &&
      (!isLoopback(a) || isIpv4Literal(env.rootHost) || env.rootHost == "localhost" ||
       env.size == 1)) {
    bind.sin_addr = a;
    where = "the root address";
  } else if (ifname) {
    std::string name;
    LR_RETURN_IF_ERROR(socketInterfaceAddress(&bind.sin_addr, &name));
    where = "LOWRANK_SOCKET_IFNAME=" + name;
  } else {
    bind.sin_addr.s_addr = htonl(INADDR_ANY);
    where = isLocalAddress(a) ? "every interface (the root address is loopback or a wildcard)"
                              : "every interface (the root address is not one of this host's)";
  }
  LR_INFO("bootstrap: comm rank 0 serves the root on %s: %s", addrString(bind).c_str(), where.c_str());
  return serveRootAt(env.root, bind, timeoutSec);
}

}  // namespace lowrank::bootstrap
