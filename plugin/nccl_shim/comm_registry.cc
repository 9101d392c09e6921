#include "nccl_shim/comm_registry.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "nccl_shim/guard.h"
#include "nccl_shim/real_nccl.h"
#include "nccl_shim/shim_log.h"

namespace lowrank::shim {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<ncclComm_t, std::shared_ptr<ShimComm>> comms;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: the exit report reads it
  return *r;
}

pid_t armedBy = 0;  // the process that registered reportAtExit (a forked child inherits it)

// One line per communicator still alive when the process exits.
void reportAtExit() {
  if (getpid() != armedBy) return;  // a forked child that calls exit(): not its communicators
  std::vector<std::shared_ptr<ShimComm>> all;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    for (auto& [k, c] : registry().comms) all.push_back(c);
  }
  for (const auto& c : all) reportComm(*c, "at exit");
}

}  // namespace

void queryRanks(ShimComm& c) {
  const Real* real = shim::real();
  if (!real) return;
  Guard g;
  if (real->commUserRank(c.nccl, &c.rank) != ncclSuccess) c.rank = -1;
  if (real->commCount(c.nccl, &c.nranks) != ncclSuccess) c.nranks = 0;
  if (!real->commCuDevice || real->commCuDevice(c.nccl, &c.cudaDev) != ncclSuccess) c.cudaDev = -1;
}

std::shared_ptr<ShimComm> commFor(ncclComm_t comm) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.comms.find(comm);
    if (it != r.comms.end()) return it->second;
  }
  auto c = std::make_shared<ShimComm>(comm);
  queryRanks(*c);
  static std::once_flag armed;
  std::call_once(armed, [] {
    armedBy = getpid();
    atexit(reportAtExit);
  });
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, inserted] = r.comms.emplace(comm, c);
  return it->second;
}

std::shared_ptr<ShimComm> findComm(ncclComm_t comm, bool take) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.comms.find(comm);
  if (it == r.comms.end()) return nullptr;
  std::shared_ptr<ShimComm> c = it->second;
  if (take) r.comms.erase(it);
  return c;
}

void forEachComm(const std::function<void(ShimComm&)>& fn) {
  std::vector<std::shared_ptr<ShimComm>> all;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    for (auto& [k, c] : registry().comms) all.push_back(c);
  }
  for (const auto& c : all) fn(*c);
}

void reportComm(const ShimComm& c, const char* when) {
  SHIM_INFO("comm %p (comm rank %d of %d, device %d) %s: %llu calls compressed, %llu exact in "
            "lowrank, %llu passed through to NCCL, %lld bytes saved",
            (void*)c.nccl, c.rank, c.nranks, c.cudaDev, when,
            (unsigned long long)c.compressed.load(), (unsigned long long)c.exactInLowrank.load(),
            (unsigned long long)c.passedThrough.load(), (long long)c.bytesSaved.load());
}

}  // namespace lowrank::shim
