// allgatherBlobs: a comm rank's side of the rendezvous (protocol in wire.h).
#include <cerrno>
#include <cstring>

#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/socket.h"
#include "transport/bootstrap/wire.h"

namespace lowrank::bootstrap {
namespace {

// A Status for a failed read or write of `what` from/to the root.
Status ioError(Io io, int err, const char* what, const RootInfo& root, int rank, double timeoutSec) {
  std::string addr = addrString(root.addr);
  switch (io) {
    case Io::Timeout:
      return Status::Error(lowrankTimeout,
                           "bootstrap: comm rank %d waited %g s for %s (root %s); did every comm "
                           "rank join?", rank, timeoutSec, what, addr.c_str());
    case Io::Error:
      if (err != ECONNRESET && err != EPIPE) break;
      [[fallthrough]];  // a reset is the root closing on us (it closes a refused peer at once)
    case Io::Eof:
      return Status::Error(lowrankRemoteError,
                           "bootstrap: root %s closed the connection while comm rank %d waited "
                           "for %s (refused: wrong id or secret, e.g. LOWRANK_SECRET differs; or "
                           "the root gave up)", addr.c_str(), rank, what);
    default:
      break;
  }
  return Status::Error(lowrankSystemError, "bootstrap: comm rank %d, %s (root %s): %s", rank, what,
                       addr.c_str(), strerror(err));
}

}  // namespace

Status allgatherBlobs(const lowrankUniqueId& id, int rank, int nranks, const std::string& blob,
                      double timeoutSec, std::vector<std::string>* all) {
  if (!all) return Status::Error(lowrankInvalidArgument, "allgatherBlobs: null output");
  if (nranks < 1 || uint32_t(nranks) > kMaxRanks || rank < 0 || rank >= nranks)
    return Status::Error(lowrankInvalidArgument, "bootstrap: comm rank %d of %d is out of range (1..%u)",
                         rank, nranks, kMaxRanks);
  if (blob.size() > kMaxBlob)
    return Status::Error(lowrankInvalidArgument, "bootstrap: blob of %zu bytes exceeds %u",
                         blob.size(), kMaxBlob);
  if (!(timeoutSec > 0))
    return Status::Error(lowrankInvalidArgument, "bootstrap: timeout %g s, must be > 0", timeoutSec);
  RootInfo root;
  LR_RETURN_IF_ERROR(decodeUniqueId(id, &root));

  Deadline dl(timeoutSec);
  Fd fd;
  int err = 0;
  Io io = connectRetry(root.addr, dl, &fd, &err);
  if (io != Io::Ok) return ioError(io, err, "a connection", root, rank, timeoutSec);

  std::vector<uint8_t> hello(kHelloFixedBytes + blob.size());
  putU64(hello.data(), kHelloMagic);
  std::memcpy(hello.data() + 8, root.secret, kSecretBytes);
  putU32(hello.data() + 8 + kSecretBytes, uint32_t(rank));
  putU32(hello.data() + 12 + kSecretBytes, uint32_t(nranks));
  putU32(hello.data() + 16 + kSecretBytes, uint32_t(blob.size()));
  std::memcpy(hello.data() + kHelloFixedBytes, blob.data(), blob.size());
  io = writeFull(fd.get(), hello.data(), hello.size(), dl, &err);
  if (io != Io::Ok) return ioError(io, err, "sending its hello", root, rank, timeoutSec);

  uint8_t head[8];
  io = readFull(fd.get(), head, sizeof head, dl, &err);
  if (io != Io::Ok) return ioError(io, err, "the other comm ranks", root, rank, timeoutSec);
  uint32_t code = getU32(head), n = getU32(head + 4);
  if (code != 0) {
    if (n > kMaxErrorMsg || code >= lowrankNumResults)
      return Status::Error(lowrankRemoteError, "bootstrap: malformed error reply from the root");
    std::string msg(n, '\0');
    io = readFull(fd.get(), msg.data(), n, dl, &err);
    if (io != Io::Ok) return ioError(io, err, "the root's error message", root, rank, timeoutSec);
    return Status::Error(lowrankResult_t(code), "%s (seen by comm rank %d)", msg.c_str(), rank);
  }
  if (n != uint32_t(nranks))
    return Status::Error(lowrankRemoteError, "bootstrap: the root sent a table of %u comm ranks, "
                         "expected %d", n, nranks);
  std::vector<uint8_t> lens(4 * size_t(n));
  io = readFull(fd.get(), lens.data(), lens.size(), dl, &err);
  if (io != Io::Ok) return ioError(io, err, "the table", root, rank, timeoutSec);
  all->assign(n, std::string());
  for (uint32_t r = 0; r < n; ++r) {
    uint32_t len = getU32(lens.data() + 4 * r);
    if (len > kMaxBlob)
      return Status::Error(lowrankRemoteError, "bootstrap: table entry %u of %u bytes exceeds %u", r,
                           len, kMaxBlob);
    (*all)[r].resize(len);
    io = readFull(fd.get(), (*all)[r].data(), len, dl, &err);
    if (io != Io::Ok) return ioError(io, err, "the table", root, rank, timeoutSec);
  }
  if ((*all)[size_t(rank)] != blob)
    return Status::Error(lowrankRemoteError, "bootstrap: the table's entry of comm rank %d is not "
                         "its blob", rank);
  return Status::Ok();
}

}  // namespace lowrank::bootstrap
