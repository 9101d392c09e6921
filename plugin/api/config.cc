#include "api/config.h"

#include <climits>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "util/dtype.h"
#include "util/env.h"
#include "util/log.h"

namespace lowrank::api {
static_assert(offsetof(lowrankConfig_t, factorDtype) == kConfigSizeBeforeFactorDtype,
              "the struct before factorDtype ended there");
namespace {

Status argError(const char* field, const char* want) {
  return Status::Error(lowrankInvalidArgument, "lowrankConfig_t.%s must be %s", field, want);
}

}  // namespace

Status timeoutFromEnv(double* seconds) {
  *seconds = 300;
  return env::number("LOWRANK_TIMEOUT", 0, true, seconds);
}

Status resolveConfig(const lowrankConfig_t* user, EngineConfig* out) {
  EngineConfig c;  // defaults
  LR_RETURN_IF_ERROR(env::checkDebug());
  LR_RETURN_IF_ERROR(env::integer("LOWRANK_APPROX_RANK", 0, 1 << 16, &c.approxRank));
  LR_RETURN_IF_ERROR(env::number("LOWRANK_MIN_COMPRESSION_RATE", 1, false, &c.minCompressionRate));
  LR_RETURN_IF_ERROR(env::integer("LOWRANK_START_ITER", 0, 1 << 30, &c.startIter));
  LR_RETURN_IF_ERROR(env::boolean("LOWRANK_ERROR_FEEDBACK", &c.errorFeedback));
  LR_RETURN_IF_ERROR(env::boolean("LOWRANK_WARM_START", &c.warmStart));
  LR_RETURN_IF_ERROR(env::number("LOWRANK_ORTHO_EPSILON", 0, false, &c.orthoEpsilon));
  // lowrankConfig_t.seed is a long long: a seed above it could not be given back there.
  LR_RETURN_IF_ERROR(env::unsignedInteger("LOWRANK_SEED", &c.seed, LLONG_MAX));
  LR_RETURN_IF_ERROR(env::number("LOWRANK_TIMEOUT", 0, true, &c.timeoutSec));
  LR_RETURN_IF_ERROR(env::boolean("LOWRANK_PIPELINE", &c.pipeline));
  LR_RETURN_IF_ERROR(env::boolean("LOWRANK_ALTERNATE", &c.alternate));
  {
    // the short words, and the long ones Python's factor_dtype takes too (any case, as every choice)
    const char* names[6] = {"fp32", "bf16", "fp16", "float32", "bfloat16", "float16"};
    const lowrankDataType_t types[3] = {lowrankFloat32, lowrankBfloat16, lowrankFloat16};
    int i = 0;
    LR_RETURN_IF_ERROR(env::choice("LOWRANK_FACTOR_DTYPE", names, 6, &i));
    c.factorDtype = types[i % 3];
  }
  int chunk = int(c.pipelineChunk);
  LR_RETURN_IF_ERROR(env::integer("LOWRANK_PIPELINE_CHUNK", 1, 1 << 30, &chunk));
  c.pipelineChunk = uint64_t(chunk);
  // The host transport's cost model (microseconds per step, nanoseconds per byte) and a forced
  // algorithm: the choice must be the same on every comm rank, so must these.
  // Each one set pins it; the others are measured when the communicator is made
  // (LOWRANK_UCX_PROBE, on by default: transport/ucx/link_probe.h).
  double alphaUs = -1, betaNs = -1, overheadUs = -1;
  LR_RETURN_IF_ERROR(env::number("LOWRANK_UCX_ALPHA_US", 0, true, &alphaUs));
  LR_RETURN_IF_ERROR(env::number("LOWRANK_UCX_BETA_NS", 0, true, &betaNs));
  LR_RETURN_IF_ERROR(env::number("LOWRANK_UCX_OVERHEAD_US", 0, false, &overheadUs));
  if ((c.ucxAlphaPinned = alphaUs >= 0)) c.ucxCost.alphaSec = alphaUs * 1e-6;
  if ((c.ucxBetaPinned = betaNs >= 0)) c.ucxCost.betaSecPerByte = betaNs * 1e-9;
  if ((c.ucxOverheadPinned = overheadUs >= 0)) c.ucxCost.overheadSec = overheadUs * 1e-6;
  LR_RETURN_IF_ERROR(env::boolean("LOWRANK_UCX_PROBE", &c.ucxProbe));
  // auto (the cost model), each algorithm by name, or tune (timed on the first calls, agreed by
  // every comm rank: transport/ucx/tuner.h).
  const char* algos[2 + ucx::kNumAlgorithms] = {"auto"};
  for (int i = 0; i < ucx::kNumAlgorithms; ++i) algos[1 + i] = ucx::kAlgorithmNames[i];
  algos[1 + ucx::kNumAlgorithms] = "tune";
  int algo = 0;
  LR_RETURN_IF_ERROR(env::choice("LOWRANK_UCX_ALGO", algos, 2 + ucx::kNumAlgorithms, &algo));
  if (algo > 0 && algo <= ucx::kNumAlgorithms) c.ucxAlgorithm = ucx::Algorithm(algo - 1);
  c.ucxTune = algo == 1 + ucx::kNumAlgorithms;
  LR_RETURN_IF_ERROR(env::integer("LOWRANK_TEST_FAIL_ALLOC", -1, 1 << 30, &c.testFailAllocRank));
  if (user) {
    if (!configSizeKnown(user->size) || user->magic != LOWRANK_CONFIG_MAGIC)
      return Status::Error(lowrankInvalidArgument,
                           "lowrankConfig_t not initialized with LOWRANK_CONFIG_INITIALIZER "
                           "(size %zu, magic 0x%x)", user->size, user->magic);
    lowrankConfig_t u = LOWRANK_CONFIG_INITIALIZER;  // fields an older struct lacks: unset
    std::memcpy(&u, user, user->size);
    if (u.approxRank != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.approxRank < 0 || u.approxRank > (1 << 16)) return argError("approxRank", "in [0, 65536]");
      c.approxRank = u.approxRank;
    }
    if (u.minCompressionRate != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.minCompressionRate >= 1) || !std::isfinite(u.minCompressionRate))
        return argError("minCompressionRate", ">= 1");
      c.minCompressionRate = u.minCompressionRate;
    }
    if (u.startIter != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.startIter < 0 || u.startIter > (1 << 30)) return argError("startIter", "in [0, 2^30]");
      c.startIter = u.startIter;
    }
    if (u.errorFeedback != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.errorFeedback != 0 && u.errorFeedback != 1) return argError("errorFeedback", "0 or 1");
      c.errorFeedback = u.errorFeedback;
    }
    if (u.warmStart != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.warmStart != 0 && u.warmStart != 1) return argError("warmStart", "0 or 1");
      c.warmStart = u.warmStart;
    }
    if (u.orthoEpsilon != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.orthoEpsilon >= 0) || !std::isfinite(u.orthoEpsilon)) return argError("orthoEpsilon", ">= 0");
      c.orthoEpsilon = u.orthoEpsilon;
    }
    if (u.seed != LOWRANK_CONFIG_UNDEF_SEED) {
      if (u.seed < 0) return argError("seed", ">= 0");
      c.seed = uint64_t(u.seed);
    }
    if (u.timeoutSec != LOWRANK_CONFIG_UNDEF_DOUBLE) {
      if (!(u.timeoutSec > 0) || !std::isfinite(u.timeoutSec)) return argError("timeoutSec", "> 0");
      c.timeoutSec = u.timeoutSec;
    }
    if (u.pipeline != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.pipeline != 0 && u.pipeline != 1) return argError("pipeline", "0 or 1");
      c.pipeline = u.pipeline;
    }
    if (u.alternate != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.alternate != 0 && u.alternate != 1) return argError("alternate", "0 or 1");
      c.alternate = u.alternate;
    }
    if (u.factorDtype != LOWRANK_CONFIG_UNDEF_INT) {
      if (u.factorDtype != lowrankFloat32 && u.factorDtype != lowrankBfloat16 &&
          u.factorDtype != lowrankFloat16)
        return Status::Error(lowrankInvalidArgument,
                             "lowrankConfig_t.factorDtype must be lowrankFloat32, lowrankBfloat16 or "
                             "lowrankFloat16 (%d, %d or %d), not %d", int(lowrankFloat32),
                             int(lowrankBfloat16), int(lowrankFloat16), u.factorDtype);
      c.factorDtype = lowrankDataType_t(u.factorDtype);
    }
  }
  // Alternation keeps the factor of the last call on every rank: it has no cold start.
  if (c.alternate && !c.warmStart)
    return Status::Error(lowrankInvalidArgument,
                         "alternate 1 (LOWRANK_ALTERNATE) needs warmStart 1 (LOWRANK_WARM_START): "
                         "alternating PowerSGD compresses against the factor of the last call");
  *out = c;
  return Status::Ok();
}

void logConfig(const EngineConfig& c, int rank, int nranks) {
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", LOWRANK_MAJOR, LOWRANK_MINOR, LOWRANK_PATCH);
  logVersionOnce(v);
  LR_INFO("comm rank %d/%d: approxRank %d, minCompressionRate %g, startIter %d, errorFeedback %d, "
          "warmStart %d, alternate %d, factors %s, orthoEpsilon %g, seed %llu, timeout %g s, pipeline %d "
          "(chunk %llu elements), host allreduce %s (alpha %g us, beta %g ns/byte)",
          rank, nranks, c.approxRank, c.minCompressionRate, c.startIter, int(c.errorFeedback),
          int(c.warmStart), int(c.alternate), factorDtypeName(c.factorDtype), c.orthoEpsilon, (unsigned long long)c.seed, c.timeoutSec,
          int(c.pipeline), (unsigned long long)c.pipelineChunk,
          c.ucxAlgorithm ? ucx::algorithmName(*c.ucxAlgorithm) : c.ucxTune ? "tuned" : "by cost", c.ucxCost.alphaSec * 1e6,
          c.ucxCost.betaSecPerByte * 1e9);
}

}  // namespace lowrank::api
