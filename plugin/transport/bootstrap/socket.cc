#include "transport/bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <thread>

namespace lowrank::bootstrap {

Deadline::Deadline(double seconds) {
  // Clamp so that absurd timeouts do not overflow the clock.
  if (!(seconds > 0)) seconds = 0;
  if (seconds > 1e8) seconds = 1e8;
  at_ = std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(seconds));
}

int Deadline::remainingMs(int cap) const {
  auto left = at_ - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > cap ? cap : int(ms);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool setNonBlocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return false;
  int fdfl = fcntl(fd, F_GETFD);
  return fdfl >= 0 && fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) >= 0;
}

// Waits for `events` on fd until dl; Ok when ready, Timeout, or Error.
static Io waitFd(int fd, short events, const Deadline& dl, int* err) {
  for (;;) {
    if (dl.expired()) return Io::Timeout;
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, dl.remainingMs());
    if (r > 0) return Io::Ok;  // readiness or an error condition: the next call reports which
    if (r < 0 && errno != EINTR) {
      *err = errno;
      return Io::Error;
    }
  }
}

Io readFull(int fd, void* buf, size_t n, const Deadline& dl, int* err) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += size_t(r);
    } else if (r == 0) {
      return Io::Eof;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Io w = waitFd(fd, POLLIN, dl, err);
      if (w != Io::Ok) return w;
    } else if (errno != EINTR) {
      *err = errno;
      return Io::Error;
    }
  }
  return Io::Ok;
}

Io writeFull(int fd, const void* buf, size_t n, const Deadline& dl, int* err) {
  auto* p = static_cast<const uint8_t*>(buf);
  size_t put = 0;
  while (put < n) {
    ssize_t r = ::send(fd, p + put, n - put, MSG_NOSIGNAL);
    if (r >= 0) {
      put += size_t(r);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Io w = waitFd(fd, POLLOUT, dl, err);
      if (w != Io::Ok) return w;
    } else if (errno != EINTR) {
      *err = errno;
      return Io::Error;
    }
  }
  return Io::Ok;
}

Io connectRetry(const sockaddr_in& addr, const Deadline& dl, Fd* out, int* err) {
  for (;;) {
    if (dl.expired()) return Io::Timeout;
    Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
    if (!fd.valid() || !setNonBlocking(fd.get())) {
      *err = errno;
      return Io::Error;
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int r = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    int e = r == 0 ? 0 : errno;
    if (e == EINPROGRESS || e == EINTR) {
      Io w = waitFd(fd.get(), POLLOUT, dl, err);
      if (w != Io::Ok) return w;
      socklen_t len = sizeof e;
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
    }
    if (e == 0) {
      *out = std::move(fd);
      return Io::Ok;
    }
    // The root may be slow to accept (backlog full) or not yet reachable: retry until dl.
    if (e != ECONNREFUSED && e != ETIMEDOUT && e != ENETUNREACH && e != EHOSTUNREACH &&
        e != ECONNRESET && e != EAGAIN) {
      *err = e;
      return Io::Error;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, dl.remainingMs())));
  }
}

std::string addrString(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

}  // namespace lowrank::bootstrap
