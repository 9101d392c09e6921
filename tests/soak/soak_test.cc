// The soak as a GoogleTest case, with its own flags (before GoogleTest's):
//   soak [--seed S] [--calls N] [--max-count C] [--cap-mb M] [--check-prob P] [--margin-mb M]
//        [--csv FILE] [--progress]
// Without --seed a random seed is drawn; either way it is printed, and a failure replays with it.
#include "soak/soak.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace {

lowrank::soak::Options gOptions;

void printReport(const lowrank::soak::Options& o, const lowrank::soak::Report& r) {
  std::printf(
      "soak: seed %llu, %d comm ranks, %zu calls in %.1f s (buffers up to %zu elements, "
      "largest made %zu)\n",
      (unsigned long long)o.seed, o.ranks, r.calls, r.seconds, o.maxCount, r.largestCount);
  std::printf(
      "  time: %.1f s in lowrankAllReduce, %.1f s making inputs and references before "
      "the calls, the rest checking and between calls\n",
      r.secondsAllReduce, r.secondsReference);
  std::printf(
      "  calls: %zu compressed, %zu with a non-finite input (%zu fell back), %zu exact on "
      "a buffer's memory, %zu exact on their own buffer\n",
      r.compressed, r.nonFinite, r.fallbacks, r.exactOnSlot, r.exactTemp);
  std::printf(
      "  buffers: %zu made, %zu resets, %zu releases, %zu layout changes, %zu count or "
      "dtype changes, %zu drains (every buffer released)\n",
      r.buffersMade, r.resets, r.releases, r.layoutChanges, r.reshapes, r.drains);
  std::printf(
      "  checks: %zu of the error-feedback invariant, %zu exact results bit for bit, %zu "
      "non-finite calls; outputs equal on every comm rank at every call\n",
      r.invariantChecks, r.exactChecks, r.nonFiniteChecks);
  std::printf(
      "  largest invariant error: %.3g of its tolerance, %.3g relative to the summed "
      "inputs' scale\n",
      r.worstTolFraction, r.worstRelError);
  std::printf(
      "  resident memory: baseline %.1f MB, peak %.1f MB, end %.1f MB (%.1f MB before "
      "malloc_trim), worst with no buffer %.1f MB; margin %.1f MB\n",
      r.rssBaseline / 1e6, r.rssPeak / 1e6, r.rssEnd / 1e6, r.rssEndUntrimmed / 1e6,
      r.rssWorstDrain / 1e6, o.rssMarginBytes / 1e6);
  std::printf("  state: peak %.1f MB (all ranks), at the end %llu bytes in %llu buffers\n",
              r.statePeak / 1e6, (unsigned long long)r.stateEnd, (unsigned long long)r.buffersEnd);
}

TEST(Soak, MixedCallsKeepTheInvariantAndGiveMemoryBack) {
  const lowrank::soak::Report r = lowrank::soak::runSoak(gOptions);
  printReport(gOptions, r);
  for (const std::string& f : r.failures) ADD_FAILURE() << f;
  if (!r.failures.empty())
    std::printf("replay: soak --seed %llu --calls %zu --max-count %zu\n",
                (unsigned long long)gOptions.seed, gOptions.calls, gOptions.maxCount);
  EXPECT_EQ(r.calls, gOptions.calls);
  EXPECT_GT(r.invariantChecks, 0u);
  EXPECT_GT(r.exactChecks, 0u);
  EXPECT_EQ(r.stateEnd, 0u);
  EXPECT_EQ(r.buffersEnd, 0u);
  EXPECT_LE(r.rssEnd, r.rssBaseline + gOptions.rssMarginBytes);
}

// The soak must be able to fail: one residual element moved behind the engine's back (as a lost
// or doubled error-feedback update would) is found by the invariant check.
TEST(Soak, FindsAResidualMovedBehindTheEnginesBack) {
  lowrank::soak::Options o;
  o.seed = gOptions.seed;
  o.calls = 80;
  o.maxCount = 1 << 14;
  o.corruptResidualFrom = 20;
  const lowrank::soak::Report r = lowrank::soak::runSoak(o);
  ASSERT_FALSE(r.failures.empty()) << "the moved residual went unnoticed";
  EXPECT_NE(r.failures[0].find("error-feedback invariant off"), std::string::npos) << r.failures[0];
  EXPECT_LT(r.calls, o.calls) << "the soak stops at its first failure";
}

bool parse(int argc, char** argv) {
  gOptions.seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--progress")
      gOptions.progress = true;
    else if (a == "--seed" && (v = value()))
      gOptions.seed = std::strtoull(v, nullptr, 0);
    else if (a == "--calls" && (v = value()))
      gOptions.calls = std::strtoull(v, nullptr, 0);
    else if (a == "--max-count" && (v = value()))
      gOptions.maxCount = std::strtoull(v, nullptr, 0);
    else if (a == "--cap-mb" && (v = value()))
      gOptions.capBytes = std::atof(v) * 1e6;
    else if (a == "--check-prob" && (v = value()))
      gOptions.checkProb = std::atof(v);
    else if (a == "--margin-mb" && (v = value()))
      gOptions.rssMarginBytes = size_t(std::atof(v) * 1e6);
    else if (a == "--csv" && (v = value()))
      gOptions.csv = v;
    else {
      std::fprintf(stderr, "soak: unknown or incomplete flag '%s' (see the top of soak_test.cc)\n",
                   a.c_str());
      return false;
    }
  }
  if (gOptions.maxCount < 1 || gOptions.calls < 1) {
    std::fprintf(stderr, "soak: --calls and --max-count must be at least 1\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Large blocks straight from mmap, always: glibc otherwise raises its mmap threshold after the
  // first large free (up to 32 MB) and keeps such blocks in the rank threads' arenas, whose tops
  // malloc_trim does not return; resident memory would then measure the allocator's cache.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
  ::testing::InitGoogleTest(&argc, argv);  // takes its --gtest_* flags out of argv
  if (!parse(argc, argv)) return 2;
  std::printf("soak: seed %llu\n", (unsigned long long)gOptions.seed);
  std::fflush(stdout);
  return RUN_ALL_TESTS();
}
