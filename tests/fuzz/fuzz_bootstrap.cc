// Fuzz target: the bootstrap's root server (plugin/transport/bootstrap/server.cc) and the unique
// id's decoder. Each input opens up to three connections to a fresh root that send what the input
// says (with or without the right magic and secret in front, closed early or left open), then a
// real comm rank joins a one-rank communicator. Checks: the server never crashes or hangs; a peer
// without the secret never stops the real rank from joining; whatever fails, fails with one of the
// documented errors. And: a decoded unique id encodes back to itself.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/socket.h"
#include "transport/bootstrap/wire.h"

using namespace lowrank;
using namespace lowrank::bootstrap;

namespace {

constexpr const char* kName = "bootstrap";
#define CHECK(cond) FUZZ_CHECK(kName, cond, #cond)

void checkUniqueId(fuzz::Input& in) {
  lowrankUniqueId id;
  for (char& c : id.internal) c = char(in.byte());
  if (in.flag()) {  // often a well-formed header, so that the address checks are reached
    putU64(reinterpret_cast<uint8_t*>(id.internal), kIdMagic);
    putU32(reinterpret_cast<uint8_t*>(id.internal) + 8, kIdVersion);
  }
  RootInfo info;
  const Status st = decodeUniqueId(id, &info);
  if (!st.ok()) {
    CHECK(st.code == lowrankInvalidArgument && !st.msg.empty());
    return;
  }
  CHECK(info.addr.sin_family == AF_INET && info.addr.sin_port != 0);
  lowrankUniqueId again;
  encodeUniqueId(info, &again);
  RootInfo back;
  CHECK(decodeUniqueId(again, &back).ok());
  CHECK(std::memcmp(&back.addr, &info.addr, sizeof info.addr) == 0 &&
        secretEqual(back.secret, info.secret));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  checkUniqueId(in);

  // The root's server lives until its communicator forms or its timeout: short, so that the
  // servers of inputs whose rendezvous fails do not pile up (file descriptors) while fuzzing.
  lowrankUniqueId id;
  const Status made = makeUniqueId(&id, 3);
  if (!made.ok()) {
    // Out of file descriptors or ports (sockets in TIME_WAIT after a long fuzzing run) is the
    // machine's limit, not a bug; anything else is.
    const bool exhausted = made.msg.find("Too many open files") != std::string::npos ||
                           made.msg.find("Cannot assign requested address") != std::string::npos ||
                           made.msg.find("Address already in use") != std::string::npos;
    FUZZ_CHECK(kName, exhausted, "makeUniqueId: " + made.msg);
    return 0;
  }
  RootInfo root;
  CHECK(decodeUniqueId(id, &root).ok());
  std::vector<int> peers;
  bool secretKnown = false;
  for (size_t g = in.range(0, 3); g > 0; --g) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&root.addr), sizeof root.addr) != 0) {
      ::close(fd);  // the root refuses connections beyond its pending limit: not this test's case
      continue;
    }
    std::vector<uint8_t> bytes;
    if (in.flag()) {  // past the magic and the secret, into the header and blob checks
      bytes.resize(8 + kSecretBytes);
      putU64(bytes.data(), kHelloMagic);
      std::memcpy(bytes.data() + 8, root.secret, kSecretBytes);
      secretKnown = true;
    }
    for (size_t n = in.range(0, 48); n > 0; --n) bytes.push_back(in.byte());
    if (!bytes.empty()) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (in.flag()) ::close(fd);
    else peers.push_back(fd);
  }

  std::vector<std::string> all;
  const Status st = allgatherBlobs(id, 0, 1, "blob", secretKnown ? 1 : 10, &all);
  if (st.ok()) {
    CHECK(all.size() == 1 && all[0] == "blob");
  } else {
    // Only a peer with the secret can disturb the rendezvous (a hello with other nranks, or taking
    // the one comm rank's place), and then with the errors allgatherBlobs documents.
    CHECK(secretKnown);
    CHECK(st.code == lowrankRemoteError || st.code == lowrankTimeout ||
          st.code == lowrankSystemError);
  }
  for (int fd : peers) ::close(fd);
  return 0;
}
