// The worker of the multi-process NCCL tests (driven by nccl_mp_test.py), linked with -lnccl
// against the NCCL test double and with liblowrank. Public C API only.
//
//   nccl_worker compare RANK NRANKS IDFILE PREFIX
//       Comm rank 0 makes an ncclUniqueId and two lowrankUniqueIds and writes them to IDFILE
//       (atomically: a temporary file renamed); the others wait for it. Every process then makes
//       an NCCL communicator of the double and, for pipeline 0 and 1, a lowrank communicator over
//       it (lowrankCommInitFromNcclConfig) and one over UCX (lowrankCommInitRankConfig) with the
//       same config, runs tests/nccl/scenario.h on both and checks the outputs are equal bit for
//       bit, that compressed calls were made, and that the factor allreduces were pncclAllReduce
//       calls (never ncclAllReduce). Writes the outputs over NCCL to PREFIX.<rank>.
//   nccl_worker init
//       One comm rank: an NCCL communicator, then lowrankCommInitFromNccl; prints
//       "RESULT <code>: <message>".
//
// Exit codes: 0 success, 1 a check failed, 2 usage.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "lowrank/lowrank_nccl.h"
#include "nccl_double.h"
#include "scenario.h"

namespace {

struct Ids {
  ncclUniqueId nccl;
  lowrankUniqueId ucx[2];  // one UCX communicator per pipeline setting
};

bool writeFileAtomically(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(data, 1, size, f) == size;
  ok = std::fclose(f) == 0 && ok;
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool readIds(const std::string& path, Ids* ids) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool ok = std::fread(ids, 1, sizeof *ids, f) == sizeof *ids;
      std::fclose(f);
      return ok;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int failed(int rank, const std::string& what) {
  std::fprintf(stderr, "comm rank %d: %s\n", rank, what.c_str());
  return 1;
}

// One pipeline setting: the scenario over NCCL and over UCX, compared. Appends the NCCL outputs.
int compareOnce(int rank, int n, ncclComm_t nccl, const lowrankUniqueId& ucxId, int pipeline,
                std::string* out) {
  lowrankConfig_t cfg = ncclscenario::config(pipeline);
  lowrankComm_t overUcx = nullptr, overNccl = nullptr;
  if (lowrankCommInitRankConfig(&overUcx, n, ucxId, rank, &cfg) != lowrankSuccess)
    return failed(rank, std::string("lowrankCommInitRankConfig: ") + lowrankGetLastError(nullptr));
  if (lowrankCommInitFromNcclConfig(&overNccl, nccl, &cfg) != lowrankSuccess)
    return failed(rank, std::string("lowrankCommInitFromNcclConfig: ") + lowrankGetLastError(nullptr));
  std::string outUcx, outNccl, err;
  if (ncclscenario::run(overUcx, rank, &outUcx, &err) != lowrankSuccess) return failed(rank, "over UCX: " + err);
  if (ncclscenario::run(overNccl, rank, &outNccl, &err) != lowrankSuccess) return failed(rank, "over NCCL: " + err);
  lowrankStats_t sn, su;
  lowrankGetStats(overNccl, &sn);
  lowrankGetStats(overUcx, &su);
  lowrankCommDestroy(overUcx);
  lowrankCommDestroy(overNccl);
  if (outNccl != outUcx) return failed(rank, "pipeline " + std::to_string(pipeline) + ": outputs over NCCL differ from UCX");
  if (sn.compressedCalls == 0 || sn.compressedCalls != su.compressedCalls)
    return failed(rank, "compressed calls: " + std::to_string(sn.compressedCalls) + " over NCCL, " +
                            std::to_string(su.compressedCalls) + " over UCX");
  std::printf("MATCH comm rank %d of %d, pipeline %d: %zu bytes, %llu compressed calls, %llu bytes sent\n",
              rank, n, pipeline, outNccl.size(), (unsigned long long)sn.compressedCalls,
              (unsigned long long)sn.bytesSent);
  out->append(outNccl);
  return 0;
}

int modeCompare(int rank, int n, const std::string& idFile, const std::string& prefix) {
  Ids ids;
  if (rank == 0) {
    if (ncclGetUniqueId(&ids.nccl) != ncclSuccess) return failed(rank, ncclGetLastError(nullptr));
    for (auto& id : ids.ucx)
      if (lowrankGetUniqueId(&id) != lowrankSuccess) return failed(rank, lowrankGetLastError(nullptr));
    if (!writeFileAtomically(idFile, &ids, sizeof ids)) return failed(rank, "cannot write " + idFile);
  } else if (!readIds(idFile, &ids)) {
    return failed(rank, "no unique ids in " + idFile);
  }
  ncclComm_t nccl = nullptr;
  if (ncclCommInitRank(&nccl, n, ids.nccl, rank) != ncclSuccess)
    return failed(rank, std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr));
  std::string out;
  for (int pipeline = 0; pipeline < 2; ++pipeline)
    if (int rc = compareOnce(rank, n, nccl, ids.ucx[pipeline], pipeline, &out)) return rc;
  // The factor allreduces went to the library's own symbol, never the interposable one.
  const unsigned long long p = ncclDoubleCallCount("pncclAllReduce");
  const unsigned long long plain = ncclDoubleCallCount("ncclAllReduce");
  std::printf("CALLS pncclAllReduce %llu ncclAllReduce %llu\n", p, plain);
  if (p == 0 || plain != 0) return failed(rank, "lowrank's NCCL calls did not all go through pncclAllReduce");
  // lowrankCommDestroy left the NCCL communicator usable.
  int x = rank;
  if (ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, nccl, nullptr) != ncclSuccess || x != n * (n - 1) / 2)
    return failed(rank, "the NCCL communicator no longer works after lowrankCommDestroy");
  if (ncclCommDestroy(nccl) != ncclSuccess) return failed(rank, ncclGetLastError(nullptr));
  const std::string path = prefix + "." + std::to_string(rank);
  if (!writeFileAtomically(path, out.data(), out.size())) return failed(rank, "cannot write " + path);
  return 0;
}

int modeInit() {
  ncclUniqueId id;
  ncclComm_t nccl = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&nccl, 1, id, 0) != ncclSuccess)
    return failed(0, std::string("NCCL double: ") + ncclGetLastError(nullptr));
  lowrankComm_t comm = nullptr;
  lowrankResult_t r = lowrankCommInitFromNccl(&comm, nccl);
  std::printf("RESULT %d: %s\n", int(r), r ? lowrankGetLastError(nullptr) : "comm rank 0 of 1");
  if (r == lowrankSuccess) lowrankCommDestroy(comm);
  ncclCommDestroy(nccl);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "compare" && argc == 6) return modeCompare(std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argv[5]);
  if (mode == "init" && argc == 2) return modeInit();
  std::fprintf(stderr, "usage: nccl_worker compare RANK NRANKS IDFILE PREFIX | init\n");
  return 2;
}
