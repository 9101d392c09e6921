// The configuration in force for a communicator, resolved and validated by the API layer from
// lowrankConfig_t and the LOWRANK_* environment (plugin/api/config.cc).
#pragma once
#include <cstdint>
#include <optional>

#include "lowrank/lowrank.h"
#include "transport/ucx/cost_model.h"

namespace lowrank {

// Device memory from the application (lowrankCommSetAllocator); both null: lowrank's own.
struct Allocator {
  lowrankAllocFn_t alloc = nullptr;
  lowrankFreeFn_t free = nullptr;
  void* userdata = nullptr;
};

struct EngineConfig {
  int approxRank = 4;              // k; 0 = compression off
  double minCompressionRate = 2;   // compress only if (n + m) k rate < n m
  int startIter = 0;               // exact calls per buffer before compression
  bool errorFeedback = true;
  bool warmStart = true;
  double orthoEpsilon = 0;         // Gram-Schmidt epsilon, as PyTorch's orthogonalization_epsilon
  uint64_t seed = 0;               // initial Q, the same on every comm rank
  double timeoutSec = 300;         // bound on every wait for a peer
  bool alternate = false;          // ACP-SGD: one factor allreduce per call (LOWRANK_ALTERNATE)
  // the dtype the factors travel in (LOWRANK_FACTOR_DTYPE): float32, bfloat16 or float16
  lowrankDataType_t factorDtype = lowrankFloat32;
  bool pipeline = true;            // overlap factor allreduces with compute, chunk by chunk
  uint64_t pipelineChunk = 1u << 23;  // elements of M per chunk (LOWRANK_PIPELINE_CHUNK)
  ucx::CostParams ucxCost;          // the host transport's alpha, beta and o (LOWRANK_UCX_ALPHA_US,
                                   // LOWRANK_UCX_BETA_NS, LOWRANK_UCX_OVERHEAD_US)
  bool ucxAlphaPinned = false, ucxBetaPinned = false, ucxOverheadPinned = false;  // set there
  bool ucxProbe = true;            // LOWRANK_UCX_PROBE: measure the links when the comm is made
  std::optional<ucx::Algorithm> ucxAlgorithm;  // set: the host transport always runs it (LOWRANK_UCX_ALGO)
  bool ucxTune = false;            // LOWRANK_UCX_ALGO=tune: timed on the first calls, agreed by all ranks
  int testFailAllocRank = -1;      // test only: this comm rank fails its plan allocations
                                   // (LOWRANK_TEST_FAIL_ALLOC), to test the collective fallback
  Allocator allocator;             // device buffers planned from now on (lowrankCommSetAllocator)
};

}  // namespace lowrank
