// The root's rendezvous server (protocol in wire.h). One poll loop over the listening socket and
// every connection, each connection a small state machine, so that a silent or slow peer never
// holds up the others.
#include "transport/bootstrap/server.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "util/log.h"

namespace lowrank::bootstrap {
namespace {

// At most this many connections that have not yet sent a complete hello; more are closed at once
// (bounds the server's fds against a flood of connections without the secret).
constexpr size_t kMaxPending = 256;

struct Conn {
  enum Stage { kMagic, kSecret, kHeader, kBlob, kJoined };
  Fd fd;
  sockaddr_in peer{};
  Stage stage = kMagic;
  std::vector<uint8_t> buf = std::vector<uint8_t>(8);  // bytes of the current stage
  size_t have = 0;
  uint32_t rank = 0, nranks = 0;
};

class Server {
 public:
  Server(Fd listenFd, const RootInfo& info, double timeoutSec)
      : listen_(std::move(listenFd)), info_(info), timeoutSec_(timeoutSec), dl_(timeoutSec) {}
  void run();

 private:
  void acceptAll();
  // Reads what is available; false when the connection is to be dropped.
  bool readConn(Conn& c);
  // Moves a connection whose stage buffer is full to its next stage; false to refuse it.
  bool advance(Conn& c);
  bool join(Conn& c);
  void drop(size_t i, const char* why);
  void sendTable();
  void failAll(lowrankResult_t code, const std::string& msg);
  size_t pending() const { return conns_.size() - joined_; }

  Fd listen_;
  RootInfo info_;
  double timeoutSec_;
  Deadline dl_;
  std::vector<std::unique_ptr<Conn>> conns_;
  uint32_t nranks_ = 0;          // from the first valid hello
  std::vector<Conn*> byRank_;    // joined connection of each comm rank
  size_t joined_ = 0;
  bool done_ = false;
};

void Server::run() {
  std::vector<pollfd> fds;
  while (!done_) {
    if (dl_.expired()) {
      std::string missing;
      for (uint32_t r = 0; r < nranks_ && missing.size() < 200; ++r)
        if (!byRank_[r]) {
          if (!missing.empty()) missing += ',';
          missing += std::to_string(r);
        }
      char msg[160];
      snprintf(msg, sizeof msg, "bootstrap: %zu of %u comm ranks joined within %g s; missing comm rank(s) ",
               joined_, nranks_, timeoutSec_);
      failAll(lowrankTimeout, msg + missing);
      LR_WARN("bootstrap: root on %s gave up after %g s (%zu comm ranks joined)",
              addrString(info_.addr).c_str(), timeoutSec_, joined_);
      return;
    }
    fds.assign(1, pollfd{listen_.get(), POLLIN, 0});
    for (auto& c : conns_) fds.push_back(pollfd{c->fd.get(), POLLIN, 0});
    int r = ::poll(fds.data(), fds.size(), dl_.remainingMs());
    if (r < 0 && errno != EINTR) {
      failAll(lowrankSystemError, std::string("bootstrap: root poll: ") + strerror(errno));
      return;
    }
    if (r <= 0) continue;
    // Connections first (indices match fds[1..]), from the back so that drops do not shift them.
    for (size_t i = conns_.size(); i-- > 0 && !done_;) {
      if (!fds[i + 1].revents) continue;
      Conn& c = *conns_[i];
      if (c.stage == Conn::kJoined) {  // a joined rank must stay silent until the table comes
        drop(i, "closed or sent data after its hello");
      } else if (!readConn(c)) {
        drop(i, "refused");
      } else if (c.stage == Conn::kJoined) {
        if (!join(c)) return;  // failAll ran
      }
    }
    if (done_) return;
    if (fds[0].revents) acceptAll();
  }
}

void Server::acceptAll() {
  for (;;) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept(listen_.get(), reinterpret_cast<sockaddr*>(&peer), &len);
    if (fd < 0) return;  // EAGAIN, or a transient error (e.g. the peer reset): poll again
    Fd owned(fd);
    if (pending() >= kMaxPending || !setNonBlocking(fd)) {
      LR_WARN("bootstrap: refused a connection from %s (too many pending)", addrString(peer).c_str());
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd = std::move(owned);
    c->peer = peer;
    conns_.push_back(std::move(c));
  }
}

bool Server::readConn(Conn& c) {
  while (c.stage != Conn::kJoined) {
    if (c.have < c.buf.size()) {
      ssize_t r = ::recv(c.fd.get(), c.buf.data() + c.have, c.buf.size() - c.have, 0);
      if (r == 0) return false;
      if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.have += size_t(r);
      if (c.have < c.buf.size()) continue;
    }
    if (!advance(c)) return false;
  }
  return true;
}

bool Server::advance(Conn& c) {
  const uint8_t* p = c.buf.data();
  switch (c.stage) {
    case Conn::kMagic:
      if (getU64(p) != kHelloMagic) {
        LR_WARN("bootstrap: refused %s: bad magic", addrString(c.peer).c_str());
        return false;
      }
      c.stage = Conn::kSecret;
      c.buf.assign(kSecretBytes, 0);
      break;
    case Conn::kSecret:
      if (!secretEqual(p, info_.secret)) {
        LR_WARN("bootstrap: refused %s: wrong secret", addrString(c.peer).c_str());
        return false;
      }
      c.stage = Conn::kHeader;
      c.buf.assign(12, 0);
      break;
    case Conn::kHeader: {
      c.rank = getU32(p);
      c.nranks = getU32(p + 4);
      uint32_t blobLen = getU32(p + 8);
      if (c.nranks < 1 || c.nranks > kMaxRanks || c.rank >= c.nranks || blobLen > kMaxBlob) {
        LR_WARN("bootstrap: refused %s: implausible hello (rank %u, nranks %u, blob %u bytes)",
                addrString(c.peer).c_str(), c.rank, c.nranks, blobLen);
        return false;
      }
      c.stage = Conn::kBlob;
      c.buf.assign(blobLen, 0);
      break;
    }
    case Conn::kBlob:
      c.stage = Conn::kJoined;
      return true;
    case Conn::kJoined:
      return true;
  }
  c.have = 0;
  return true;
}

bool Server::join(Conn& c) {
  if (nranks_ == 0) {
    nranks_ = c.nranks;
    byRank_.assign(nranks_, nullptr);
  }
  if (c.nranks != nranks_) {
    failAll(lowrankRemoteError, "bootstrap: nranks mismatch: comm rank " + std::to_string(c.rank) +
                                    " says " + std::to_string(c.nranks) + ", others said " +
                                    std::to_string(nranks_));
    return false;
  }
  if (byRank_[c.rank]) {
    failAll(lowrankRemoteError,
            "bootstrap: comm rank " + std::to_string(c.rank) + " joined twice (duplicate rank)");
    return false;
  }
  byRank_[c.rank] = &c;
  ++joined_;
  LR_TRACE("bootstrap: comm rank %u of %u joined from %s", c.rank, nranks_, addrString(c.peer).c_str());
  if (joined_ == nranks_) sendTable();
  return true;
}

void Server::drop(size_t i, const char* why) {
  Conn* c = conns_[i].get();
  if (c->stage == Conn::kJoined) {
    LR_WARN("bootstrap: comm rank %u (%s) %s; its slot is free again", c->rank,
            addrString(c->peer).c_str(), why);
    if (c->rank < byRank_.size() && byRank_[c->rank] == c) {
      byRank_[c->rank] = nullptr;
      --joined_;
    }
  }
  conns_.erase(conns_.begin() + ptrdiff_t(i));
}

void Server::sendTable() {
  std::vector<uint8_t> head(8 + 4 * size_t(nranks_));
  putU32(head.data(), 0);
  putU32(head.data() + 4, nranks_);
  for (uint32_t r = 0; r < nranks_; ++r) putU32(head.data() + 8 + 4 * r, uint32_t(byRank_[r]->buf.size()));
  Deadline dl(timeoutSec_);
  for (uint32_t r = 0; r < nranks_; ++r) {
    int fd = byRank_[r]->fd.get(), err = 0;
    Io io = writeFull(fd, head.data(), head.size(), dl, &err);
    for (uint32_t q = 0; q < nranks_ && io == Io::Ok; ++q)
      io = writeFull(fd, byRank_[q]->buf.data(), byRank_[q]->buf.size(), dl, &err);
    if (io != Io::Ok) LR_WARN("bootstrap: could not send the table to comm rank %u", r);
  }
  LR_INFO("bootstrap: communicator of %u comm ranks formed on %s", nranks_, addrString(info_.addr).c_str());
  done_ = true;
}

void Server::failAll(lowrankResult_t code, const std::string& msg) {
  LR_WARN("%s", msg.c_str());
  std::string m = msg.substr(0, kMaxErrorMsg);
  std::vector<uint8_t> out(8 + m.size());
  putU32(out.data(), uint32_t(code));
  putU32(out.data() + 4, uint32_t(m.size()));
  std::memcpy(out.data() + 8, m.data(), m.size());
  Deadline dl(1.0);
  for (auto& c : conns_) {
    if (c->stage != Conn::kJoined) continue;
    int err = 0;
    writeFull(c->fd.get(), out.data(), out.size(), dl, &err);
  }
  done_ = true;
}

}  // namespace

Status startServer(Fd listenFd, const RootInfo& info, double timeoutSec) {
  auto server = std::make_shared<Server>(std::move(listenFd), info, timeoutSec);
  try {
    std::thread([server] { server->run(); }).detach();
  } catch (const std::system_error& e) {
    return Status::Error(lowrankSystemError, "bootstrap: cannot start the server thread: %s", e.what());
  }
  return Status::Ok();
}

}  // namespace lowrank::bootstrap
