// What ncclGetLastError reports in front of the shim. NCCL keeps the text of the last error per
// thread; the shim does the same for the errors it returns itself (a failed compressed allreduce,
// a bad variable, no real NCCL). Its text gives way to the real library's once that changes: a
// later failure in a call the shim forwards, or in one it never sees (ncclSend, ncclCommInitRank,
// ...). ncclGetLastError (entry.cc) returns the shim's text while it is the newer, else the real
// library's. Like NCCL's, the text stays valid until the thread's next error. "Newer" is told by
// the real library's text changing: a later NCCL failure with the very same text as its previous
// one goes unseen (the shim's text stays).
// Thread safety: all per thread.
#pragma once
#include <nccl.h>

namespace lowrank::shim {

// This thread's last error of the shim's own, or nullptr (none, or the real library has had one
// since: its text is the last).
const char* lastError();
void setLastError(const char* msg);
void clearLastError();

// printf-style: prints the message at WARN (whatever LOWRANK_DEBUG says: a failure the user must
// see is never silent) and makes it this thread's last error.
void reportError(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The result of a call forwarded to the real library: a failure there is its own last error.
inline ncclResult_t forwarded(int r) {
  if (r != ncclSuccess) clearLastError();
  return ncclResult_t(r);
}

}  // namespace lowrank::shim
