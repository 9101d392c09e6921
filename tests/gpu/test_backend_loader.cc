// liblowrank's loading of the CUDA backend (plugin/engine/device_backend.cc): a library that is not
// a backend of this build's table version (abi/cuda_backend.h) is refused at the first device
// buffer with lowrankSystemError naming its path and both versions; one that cannot be opened,
// with dlerror's text. Run on the CPU emulation of CUDA and the NCCL test double, once per case
// (the backend is loaded once per process): BACKEND_LOADER_EXPECT holds the words the error must
// contain, separated by '|'.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "gpu/device_support.h"

using namespace lowrank::testing;

namespace {

TEST(BackendLoader, OtherBuildIsRefusedNamingPathAndVersions) {
  LR_SKIP_WITHOUT_DEVICE();
  const char* path = getenv("LOWRANK_CUDA_BACKEND");
  const char* expect = getenv("BACKEND_LOADER_EXPECT");
  ASSERT_TRUE(path && expect) << "run by meson test (LOWRANK_CUDA_BACKEND, BACKEND_LOADER_EXPECT)";
  lowrankConfig_t cfg = LOWRANK_CONFIG_INITIALIZER;
  cfg.approxRank = 2;
  OneRankNccl one(cfg);
  const size_t count = 64 * 64;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(lowrankAllReduce(d, d, count, lowrankFloat32, lowrankSum, one.comm, nullptr),
            lowrankSystemError);
  const std::string error = lowrankGetLastError(one.comm);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  std::stringstream words(expect);
  for (std::string w; std::getline(words, w, '|');)
    EXPECT_NE(error.find(w), std::string::npos) << "no \"" << w << "\" in: " << error;
  printf("the error: %s\n", error.c_str());
  cudaFree(d);
}

}  // namespace
