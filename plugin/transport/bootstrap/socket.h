// File-descriptor helpers of the bootstrap: an owning fd, a deadline, and reads/writes that never
// block past a deadline (non-blocking sockets + poll). Every read is of an exact, caller-checked
// length.
#pragma once
#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lowrank::bootstrap {

// A point in time after which waits give up.
class Deadline {
 public:
  explicit Deadline(double seconds);
  bool expired() const { return std::chrono::steady_clock::now() >= at_; }
  // Milliseconds left, rounded up, capped at `cap` (so that poll() wakes up now and then).
  int remainingMs(int cap = 1000) const;

 private:
  std::chrono::steady_clock::time_point at_;
};

// Owns a file descriptor (closed in the destructor). Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { int f = fd_; fd_ = -1; return f; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

enum class Io { Ok, Eof, Timeout, Error };  // Error: errno is in *err

// Makes fd non-blocking and close-on-exec; false (errno set) on failure.
bool setNonBlocking(int fd);

// Exactly n bytes, or Eof / Timeout / Error. fd must be non-blocking.
Io readFull(int fd, void* buf, size_t n, const Deadline& dl, int* err);
Io writeFull(int fd, const void* buf, size_t n, const Deadline& dl, int* err);

// Connects a new non-blocking TCP socket to addr, retrying refused/unreachable attempts until dl.
// Returns Ok with *out set, Timeout, or Error (errno in *err).
Io connectRetry(const sockaddr_in& addr, const Deadline& dl, Fd* out, int* err);

std::string addrString(const sockaddr_in& a);  // "10.0.0.1:4242"

// Little-endian encoding of the wire formats.
inline void putU32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline void putU64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline uint32_t getU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t getU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace lowrank::bootstrap
