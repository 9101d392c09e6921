// Every entry point the NCCL test double exports, each under its NCCL name and its p-prefixed
// profiling twin (what lowrank's NCCL transport calls). The two are separate functions over one
// implementation so that ncclDoubleCallCount can tell them apart (and ncclDoubleFailNext can make
// one of them fail). Streams are ignored, except by the collectives of the build for the CUDA
// emulation (NCCL_DOUBLE_ON_STREAMS), which are queued on theirs.
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "double.h"
#include "util/c_enum.h"
#include "nccl_double.h"

namespace {

std::mutex countMu;
std::map<std::string, unsigned long long>& counts() {
  static auto* m = new std::map<std::string, unsigned long long>;  // never destroyed: used at exit
  return *m;
}
std::map<std::string, int>& injected() {  // ncclDoubleFailNext, under countMu
  static auto* m = new std::map<std::string, int>;
  return *m;
}

// Counts a call of `entry`; true (and *r) when an injected failure is due for it.
bool count(const char* entry, ncclResult_t* r) {
  std::lock_guard<std::mutex> lock(countMu);
  ++counts()[entry];
  auto it = injected().find(entry);
  if (it == injected().end()) return false;
  *r = ncclResult_t(it->second);
  injected().erase(it);
  return true;
}

// The entry's result: an injected failure if one is due (entries returning ncclResult_t), else
// the implementation's.
template <typename R, typename F>
R call(const char* entry, F&& impl) {
  ncclResult_t r;
  if (count(entry, &r)) {
    if constexpr (std::is_same_v<R, ncclResult_t>)
      return nccl_double::fail(r, "%s: failure injected by ncclDoubleFailNext", entry);
  }
  return impl();
}

}  // namespace

#define NCCL_EXPORT extern "C" __attribute__((visibility("default")))
#define NCCL_ENTRY(ret, name, impl, params, args)                          \
  NCCL_EXPORT ret name params {                                            \
    return call<ret>(#name, [&] { return nccl_double::impl args; });      \
  }                                                                        \
  NCCL_EXPORT ret p##name params {                                         \
    return call<ret>("p" #name, [&] { return nccl_double::impl args; });  \
  }

NCCL_ENTRY(ncclResult_t, ncclGetVersion, getVersion, (int* v), (v))
NCCL_ENTRY(ncclResult_t, ncclGetUniqueId, getUniqueId, (ncclUniqueId* id), (id))
NCCL_ENTRY(ncclResult_t, ncclCommInitRank, commInitRankConfig,
           (ncclComm_t* c, int n, ncclUniqueId id, int r), (c, n, id, r, nullptr))
NCCL_ENTRY(ncclResult_t, ncclCommInitRankConfig, commInitRankConfig,
           (ncclComm_t* c, int n, ncclUniqueId id, int r, ncclConfig_t* cfg), (c, n, id, r, cfg))
NCCL_ENTRY(ncclResult_t, ncclCommInitAll, commInitAll, (ncclComm_t* c, int n, const int* d), (c, n, d))
NCCL_ENTRY(ncclResult_t, ncclCommFinalize, commFinalize, (ncclComm_t c), (c))
NCCL_ENTRY(ncclResult_t, ncclCommDestroy, commDestroy, (ncclComm_t c), (c))
NCCL_ENTRY(ncclResult_t, ncclCommAbort, commAbort, (ncclComm_t c), (c))
NCCL_ENTRY(ncclResult_t, ncclCommCount, commCount, (const ncclComm_t c, int* n), (c, n))
NCCL_ENTRY(ncclResult_t, ncclCommUserRank, commUserRank, (const ncclComm_t c, int* r), (c, r))
NCCL_ENTRY(ncclResult_t, ncclCommCuDevice, commCuDevice, (const ncclComm_t c, int* d), (c, d))
NCCL_ENTRY(ncclResult_t, ncclCommGetAsyncError, commGetAsyncError, (ncclComm_t c, ncclResult_t* e), (c, e))
NCCL_ENTRY(const char*, ncclGetErrorString, getErrorString, (ncclResult_t r), (r))
NCCL_ENTRY(const char*, ncclGetLastError, getLastError, (ncclComm_t c), (c))
NCCL_ENTRY(ncclResult_t, ncclGroupStart, groupStart, (), ())
NCCL_ENTRY(ncclResult_t, ncclGroupEnd, groupEnd, (), ())
NCCL_ENTRY(ncclResult_t, ncclRedOpCreatePreMulSum, redOpCreatePreMulSum,
           (ncclRedOp_t* op, void* s, ncclDataType_t t, ncclScalarResidence_t res, ncclComm_t c),
           (op, s, t, res, c))
NCCL_ENTRY(ncclResult_t, ncclRedOpDestroy, redOpDestroy, (ncclRedOp_t op, ncclComm_t c), (op, c))
// The collectives (each takes its comm as c and its stream as st): run at the call, or queued on
// st in the build for the CUDA emulation.
#ifdef NCCL_DOUBLE_ON_STREAMS
#define NCCL_RUN(name, impl, args) nccl_double::onStream(st, c, name, [=] { return nccl_double::impl args; })
#else
#define NCCL_RUN(name, impl, args) ((void)st, nccl_double::impl args)
#endif
// Every collective has a datatype t: checked as an int before anything reads it as the enum.
#define NCCL_COLLECTIVE(name, impl, params, args)                                          \
  NCCL_EXPORT ncclResult_t name params {                                                   \
    return call<ncclResult_t>(#name, [&] {                                                 \
      if (ncclResult_t r = nccl_double::injectedFailure(c, #name)) return r;              \
      if (ncclResult_t r = nccl_double::checkDtype(lowrank::cEnumValue(t), #name)) return r; \
      return nccl_double::asIssued(c, NCCL_RUN(#name, impl, args));                        \
    });                                                                                    \
  }                                                                                        \
  NCCL_EXPORT ncclResult_t p##name params {                                                \
    return call<ncclResult_t>("p" #name, [&] {                                             \
      if (ncclResult_t r = nccl_double::injectedFailure(c, "p" #name)) return r;          \
      if (ncclResult_t r = nccl_double::checkDtype(lowrank::cEnumValue(t), "p" #name)) return r; \
      return nccl_double::asIssued(c, NCCL_RUN("p" #name, impl, args));                    \
    });                                                                                    \
  }

NCCL_COLLECTIVE(ncclAllReduce, allReduce,
                (const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                 cudaStream_t st), (s, r, n, t, op, c))
NCCL_COLLECTIVE(ncclBroadcast, broadcast,
                (const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                 cudaStream_t st), (s, r, n, t, root, c))
NCCL_COLLECTIVE(ncclBcast, broadcast,
                (void* b, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st),
                (b, b, n, t, root, c))
NCCL_COLLECTIVE(ncclAllGather, allGather,
                (const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st),
                (s, r, n, t, c))
NCCL_COLLECTIVE(ncclReduceScatter, reduceScatter,
                (const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                 cudaStream_t st), (s, r, n, t, op, c))
NCCL_COLLECTIVE(ncclReduce, reduce,
                (const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                 ncclComm_t c, cudaStream_t st), (s, r, n, t, op, root, c))

NCCL_EXPORT int ncclDoubleLiveComms() { return nccl_double::liveComms(); }

NCCL_EXPORT void ncclDoubleStallCollectives(int on) { nccl_double::setStalled(on != 0); }

NCCL_EXPORT void ncclDoubleFailNext(const char* entry, int result) {
  if (!entry) return;
  std::lock_guard<std::mutex> lock(countMu);
  if (result == ncclSuccess)
    injected().erase(entry);
  else
    injected()[entry] = result;
}

NCCL_EXPORT void ncclDoubleFailCollective(ncclComm_t comm, unsigned long long nth, int result) {
  if (!comm) return;
  std::lock_guard<std::mutex> lock(comm->injectMu);
  const bool cancel = nth == 0 || result == ncclSuccess;
  comm->failIn = cancel ? 0 : nth;
  comm->failWith = cancel ? ncclSuccess : ncclResult_t(result);
}

NCCL_EXPORT unsigned long long ncclDoubleCallCount(const char* entry) {
  if (!entry) return 0;
  std::lock_guard<std::mutex> lock(countMu);
  auto it = counts().find(entry);
  return it == counts().end() ? 0 : it->second;
}
