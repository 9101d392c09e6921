// One logging state and one LOWRANK_* environment per process, whichever of liblowrank, the NCCL
// shim and the CUDA backend are loaded (docs/design.md, "Layers"): the shim and the backend log and
// read their settings through liblowrank's services table (plugin/abi/services.h) instead of a
// copy of their own. The test makes liblowrank read the environment first, then changes it, then
// loads the shim and the backend: a library with its own state would read the new values (and log
// nothing, or to another file); with one state every line lands in the first file, at the first
// level, with the first settings. Run on the CPU emulation of CUDA and the NCCL test double.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "abi/services.h"
#include "lowrank/lowrank.h"
#include "lowrank/lowrank_nccl.h"

namespace {

std::vector<std::string> lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

// The lines that contain `what`.
std::vector<std::string> grep(const std::vector<std::string>& log, const std::string& what) {
  std::vector<std::string> out;
  for (const std::string& l : log)
    if (l.find(what) != std::string::npos) out.push_back(l);
  return out;
}

using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                   ncclComm_t, cudaStream_t);

TEST(OneState, LogLevelFileAndSettingsAreThoseLiblowrankRead) {
  const char* logPath = getenv("LOWRANK_DEBUG_FILE");
  const char* shimPath = getenv("ONE_STATE_SHIM");
  ASSERT_TRUE(logPath && shimPath) << "run by meson test (LOWRANK_DEBUG_FILE, ONE_STATE_SHIM)";
  const std::string other = std::string(logPath) + ".other";
  remove(logPath);
  remove(other.c_str());

  // liblowrank reads LOWRANK_DEBUG=INFO, the file, and the shim's LOWRANK_MIN_BYTES=12345.
  const lowrankServices_t* s = lowrankGetServices(LOWRANK_SERVICES_VERSION);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(lowrankGetServices(LOWRANK_SERVICES_VERSION + 1), nullptr);  // another build's table
  ASSERT_EQ(s->logLevel(), lowrankLogInfo);
  s->logWrite(lowrankLogInfo, __FILE__, __LINE__, "one-state: a line of liblowrank");
  lowrankShimSettings_t st{};
  const char* why = nullptr;
  ASSERT_EQ(s->shimSettings(&st, &why), 0) << why;
  EXPECT_EQ(st.minBytes, 12345u);

  // What a second state would read from here on.
  setenv("LOWRANK_DEBUG", "NONE", 1);
  setenv("LOWRANK_DEBUG_FILE", other.c_str(), 1);
  setenv("LOWRANK_MIN_BYTES", "999", 1);

  // The shim, loaded now: a call NCCL refuses (no communicator) still makes it find the real NCCL
  // and read its settings, both logged at INFO.
  void* shim = dlopen(shimPath, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(shim, nullptr) << dlerror();
  auto shimAllReduce = reinterpret_cast<AllReduce>(dlsym(shim, "ncclAllReduce"));
  ASSERT_NE(shimAllReduce, nullptr);
  EXPECT_NE(shimAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, nullptr, nullptr), ncclSuccess);

  // The CUDA backend, loaded by liblowrank at the first device buffer.
  ncclComm_t nccl = nullptr;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&nccl, 1, &dev), ncclSuccess);
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 2;
  cfg.startIter = 0;
  lowrankComm_t comm = nullptr;
  ASSERT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &cfg), lowrankSuccess);
  const size_t count = 64 * 64;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, count * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(lowrankAllReduce(d, d, count, lowrankFloat32, lowrankAvg, comm, stream), lowrankSuccess)
      << lowrankGetLastError(comm);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  lowrankStats_t stats{};
  ASSERT_EQ(lowrankGetStats(comm, &stats), lowrankSuccess);
  EXPECT_EQ(stats.compressedCalls, 1u);  // the device path ran, through the backend
  EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
  EXPECT_EQ(ncclCommDestroy(nccl), ncclSuccess);
  cudaFree(d);
  cudaStreamDestroy(stream);
  dlclose(shim);

  // Every line in the first file, from this process; none in the second.
  const std::vector<std::string> log = lines(logPath);
  EXPECT_FALSE(access(other.c_str(), F_OK) == 0) << "a second logging state opened " << other;
  EXPECT_EQ(grep(log, "one-state: a line of liblowrank").size(), 1u);
  EXPECT_EQ(grep(log, "NCCL shim: LD_PRELOAD shim: real NCCL").size(), 1u)
      << "the shim's INFO line, logged after LOWRANK_DEBUG became NONE";
  EXPECT_EQ(grep(log, "LOWRANK_MIN_BYTES 12345").size(), 1u)
      << "the shim saw another LOWRANK_MIN_BYTES than liblowrank read";
  EXPECT_EQ(grep(log, "LOWRANK_MIN_BYTES 999").size(), 0u);
  EXPECT_EQ(grep(log, "CUDA backend: communication stream made on device").size(), 1u)
      << "no line of the CUDA backend's own (logged through liblowrank's services)";
  const std::string pid = ":" + std::to_string(getpid()) + ":";
  for (const std::string& l : log) EXPECT_NE(l.find(pid), std::string::npos) << l;
  for (const std::string& l : log) printf("  %s\n", l.c_str());
}

}  // namespace
