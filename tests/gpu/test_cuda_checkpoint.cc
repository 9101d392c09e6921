// Checkpoint of device buffers (lowrankBufferSaveState / RestoreState through the CUDA backend's
// stateSave / stateLoad): 20 calls, save on every comm rank, everything destroyed (lowrank and NCCL
// communicators, device memory), new ones made, restore, 20 more calls: outputs bit-identical to
// the run that never stopped. Comm ranks are threads: one on the CPU emulation (NCCL test
// double), as many as there are GPUs (at most two; one thread per GPU) on real devices; two
// emulated comm ranks as processes: two_rank_worker.cc. Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "gpu/device_support.h"
#include "lowrank/lowrank_nccl.h"
#include "nccl/nccl_ranks.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

using Bytes = std::vector<unsigned char>;
const std::vector<std::vector<size_t>> kShapes = {{64, 96}, {200}, {32, 4, 5}};
constexpr size_t kCount = 64 * 96 + 200 + 32 * 4 * 5;

// The emulation runs one device for the process, whose blocking collectives would stall each
// other's ranks: one comm rank there (two-rank device runs are processes: two_rank_check.sh).
int ranksHere() {
  if (deviceName().find("emulation") != std::string::npos) return 1;
  int n = 0;
  cudaGetDeviceCount(&n);
  return std::min(n, 2);
}
int deviceOf(int rank) { return deviceName().find("emulation") != std::string::npos ? 0 : rank; }

void setLayout(lowrankComm_t comm, const void* buf) { setLayoutOf(comm, buf, kShapes); }

// Runs body(rank, comm) on n threads, each with its own NCCL and lowrank communicator.
void withDeviceComms(int n, lowrankConfig_t cfg,
                     const std::function<void(int, lowrankComm_t)>& body) {
  ncclranks::withNcclComms(n, [&](int r, ncclComm_t nccl) {
    lowrankComm_t comm = nullptr;
    lowrankConfig_t c = cfg;
    ASSERT_EQ(lowrankCommInitFromNcclConfig(&comm, nccl, &c), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    body(r, comm);
    EXPECT_EQ(lowrankCommDestroy(comm), lowrankSuccess);
  });
}

// Runs body(rank, comm, out) on n comm ranks (withDeviceComms), out a device buffer of kCount
// float32 on the rank's device, released and freed after.
void withDeviceBuffers(int n, lowrankConfig_t cfg,
                       const std::function<void(int, lowrankComm_t, void*)>& body) {
  withDeviceComms(n, cfg, [&](int r, lowrankComm_t comm) {
    ASSERT_EQ(cudaSetDevice(deviceOf(r)), cudaSuccess);
    void* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, kCount * sizeof(float)), cudaSuccess);
    body(r, comm, out);
    EXPECT_EQ(lowrankBufferRelease(comm, out), lowrankSuccess);
    cudaFree(out);
  });
}

// Calls [from, to) on the device buffer out, their outputs (as float32) appended to outs.
void calls(lowrankComm_t comm, int rank, void* out, int from, int to,
           std::vector<std::vector<float>>* outs) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (int t = from; t < to; ++t) {
    void* g = toDevice(gaussian(kCount, 1000u * t + rank), lowrankFloat32);
    ASSERT_EQ(lowrankAllReduce(g, out, kCount, lowrankFloat32, lowrankAvg, comm, s), lowrankSuccess)
        << lowrankGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (outs) outs->push_back(fromDevice(out, kCount, lowrankFloat32));
    cudaFree(g);
  }
  cudaStreamDestroy(s);
}

Bytes save(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  Bytes b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  return b;
}

TEST(DeviceCheckpoint, ResumeIsBitIdenticalOnEveryRank) {
  LR_SKIP_WITHOUT_DEVICE();
  const int N = ranksHere(), first = 20, total = 40;
  lowrankConfig_t cfg = config(3);
  cfg.seed = 5;
  std::vector<std::vector<std::vector<float>>> straight(N), resumed(N);
  std::vector<Bytes> saved(N);
  auto run = [&](const std::function<void(int, lowrankComm_t, void*)>& body) {
    withDeviceBuffers(N, cfg, body);
  };
  run([&](int r, lowrankComm_t comm, void* out) {
    setLayout(comm, out);
    calls(comm, r, out, 0, total, &straight[r]);
    expectDeviceEngineRan(comm, out, total);
  });
  run([&](int r, lowrankComm_t comm, void* out) {
    setLayout(comm, out);
    calls(comm, r, out, 0, first, nullptr);
    saved[r] = save(comm, out);
  });
  run([&](int r, lowrankComm_t comm, void* out) {
    ASSERT_EQ(lowrankBufferRestoreState(comm, out, saved[r].data(), saved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    setLayout(comm, out);
    calls(comm, r, out, first, total, &resumed[r]);
    EXPECT_EQ(save(comm, out).size(), saved[r].size());
  });
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(resumed[r].size(), size_t(total - first));
    for (int t = first; t < total; ++t)
      ASSERT_EQ(0, std::memcmp(resumed[r][t - first].data(), straight[r][t].data(),
                               kCount * sizeof(float)))
          << "rank " << r << " call " << t;
  }
  // Device bytes are the host's format: a host buffer of a host communicator takes them (the
  // identity is the same; results then differ from the device's only by the engines' rounding).
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    EXPECT_EQ(lowrankBufferRestoreState(comm, buf.data(), saved[r].data(), saved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
  }, cfg);
}

// Alternating PowerSGD (ACP-SGD): a state saved before a Q step (after 5 calls: its kept P goes
// with it, format 2's kQStep) and before a P step (after 6) resumes bit for bit on new
// communicators, 12 calls in all; the bytes say which step is next.
TEST(DeviceCheckpoint, AlternatingResumeIsBitIdenticalAtPAndQSteps) {
  LR_SKIP_WITHOUT_DEVICE();
  const int N = ranksHere(), total = 12;
  lowrankConfig_t cfg = config(3);
  cfg.seed = 5;
  cfg.alternate = 1;
  std::vector<std::vector<std::vector<float>>> straight(N);
  withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
    setLayout(comm, out);
    calls(comm, r, out, 0, total, &straight[r]);
    expectDeviceEngineRan(comm, out, total);
  });
  for (int first : {5, 6}) {
    SCOPED_TRACE(first % 2 ? "saved before a Q step" : "saved before a P step");
    std::vector<Bytes> saved(N);
    std::vector<std::vector<std::vector<float>>> resumed(N);
    withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
      setLayout(comm, out);
      calls(comm, r, out, 0, first, nullptr);
      saved[r] = save(comm, out);
    });
    for (int r = 0; r < N; ++r) {
      lowrank::SavedTensors st;
      ASSERT_TRUE(lowrank::decode(saved[r].data(), saved[r].size(), &st).ok());
      for (const lowrank::SavedTensor& t : st.tensors) {
        EXPECT_EQ(t.qStep, t.k > 0 && first % 2 == 1) << "tensor " << t.id;
        EXPECT_EQ(t.p.size(), t.qStep ? t.shape[0] * size_t(t.k) : 0u);
      }
    }
    withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
      ASSERT_EQ(lowrankBufferRestoreState(comm, out, saved[r].data(), saved[r].size()),
                lowrankSuccess) << lowrankGetLastError(comm);
      setLayout(comm, out);
      calls(comm, r, out, first, total, &resumed[r]);
    });
    for (int r = 0; r < N; ++r) {
      ASSERT_EQ(resumed[r].size(), size_t(total - first));
      for (int t = first; t < total; ++t)
        ASSERT_EQ(0, std::memcmp(resumed[r][t - first].data(), straight[r][t].data(),
                                 kCount * sizeof(float)))
            << "rank " << r << " call " << t;
    }
  }
}

// The phase crosses between the engines: a device state saved before a Q step, restored into a
// host buffer, goes on as the device run did (a Q step against the kept P, then P, Q ...), and a
// host state saved there, restored into a device buffer, goes on as the host run did; to the
// engines' rounding (1e-4 relative, float32, every call).
TEST(DeviceCheckpoint, AlternatingPhaseCrossesBetweenHostAndDevice) {
  LR_SKIP_WITHOUT_DEVICE();
  const int N = ranksHere(), first = 5, total = 10;
  lowrankConfig_t cfg = config(3);
  cfg.seed = 5;
  cfg.alternate = 1;
  auto hostCalls = [&](lowrankComm_t comm, int rank, std::vector<float>& buf, int from, int to,
                       std::vector<std::vector<float>>* outs) {
    for (int t = from; t < to; ++t) {
      const std::vector<float> g = gaussian(kCount, 1000u * t + rank);
      ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankAvg, comm,
                                 nullptr), lowrankSuccess) << lowrankGetLastError(comm);
      if (outs) outs->push_back(buf);
    }
  };
  std::vector<std::vector<std::vector<float>>> devStraight(N), hostStraight(N), hostResumed(N),
      devResumed(N);
  std::vector<Bytes> devSaved(N), hostSaved(N);
  withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
    setLayout(comm, out);
    calls(comm, r, out, 0, first, &devStraight[r]);
    devSaved[r] = save(comm, out);
    calls(comm, r, out, first, total, &devStraight[r]);
  });
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    hostCalls(comm, r, buf, 0, first, &hostStraight[r]);
    hostSaved[r] = save(comm, buf.data());
    hostCalls(comm, r, buf, first, total, &hostStraight[r]);
  }, cfg);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    ASSERT_EQ(lowrankBufferRestoreState(comm, buf.data(), devSaved[r].data(), devSaved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    setLayout(comm, buf.data());
    hostCalls(comm, r, buf, first, total, &hostResumed[r]);
  }, cfg);
  withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
    ASSERT_EQ(lowrankBufferRestoreState(comm, out, hostSaved[r].data(), hostSaved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    setLayout(comm, out);
    calls(comm, r, out, first, total, &devResumed[r]);
  });
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(hostResumed[r].size(), size_t(total - first));
    ASSERT_EQ(devResumed[r].size(), size_t(total - first));
    for (int t = 0; t < total; ++t)
      EXPECT_LT(relErr(devStraight[r][t], hostStraight[r][t]), 1e-4) << "straight, call " << t;
    for (int t = first; t < total; ++t) {
      EXPECT_LT(relErr(hostResumed[r][t - first], devStraight[r][t]), 1e-4)
          << "device state resumed on the host, rank " << r << " call " << t;
      EXPECT_LT(relErr(devResumed[r][t - first], hostStraight[r][t]), 1e-4)
          << "host state resumed on the device, rank " << r << " call " << t;
    }
  }
}

// Two comm ranks, one per device (TwoDevices in its name: run_device_checks.sh leaves it out on a
// one-GPU machine; the emulation runs one comm rank per process, where it skips).
TEST(DeviceCheckpointTwoDevices, RestoreOnOneRankOnlyIsRefusedOnEveryRank) {
  LR_SKIP_WITHOUT_DEVICE();
  const int N = ranksHere();
  if (N < 2) GTEST_SKIP() << "needs two comm ranks (one device here; the host engine's test "
                               "covers the same plan check: tests/engine/test_checkpoint.cc)";
  lowrankConfig_t cfg = config(3);
  std::vector<Bytes> saved(N);
  auto run = [&](const std::function<void(int, lowrankComm_t, void*)>& body) {
    withDeviceBuffers(N, cfg, [&](int r, lowrankComm_t comm, void* out) {
      setLayout(comm, out);
      body(r, comm, out);
    });
  };
  run([&](int r, lowrankComm_t comm, void* out) {
    calls(comm, r, out, 0, 3, nullptr);
    saved[r] = save(comm, out);
  });
  run([&](int r, lowrankComm_t comm, void* out) {
    if (r == 0) {
      ASSERT_EQ(lowrankBufferRestoreState(comm, out, saved[r].data(), saved[r].size()),
                lowrankSuccess);
    }
    void* g = toDevice(gaussian(kCount, 9u + r), lowrankFloat32);
    EXPECT_EQ(lowrankAllReduce(g, out, kCount, lowrankFloat32, lowrankAvg, comm, nullptr),
              lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("restored state"), std::string::npos)
        << lowrankGetLastError(comm);
    cudaFree(g);
  });
}

}  // namespace
