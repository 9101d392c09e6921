// The shim's policy alone (plugin/nccl_shim/policy.h): which calls are eligible, how premulsum ops
// map to sum or avg, and the sequence detection that gives lowrank only recurring calls ('C' below:
// given to lowrank, which then applies its own per-buffer warm-up, LOWRANK_START_ITER).
#include "nccl_shim/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace lowrank::shim;

namespace {

// NCCL's dtype numbers, as lowrank.h gives them.
constexpr int kFloat16 = lowrankFloat16, kFloat32 = lowrankFloat32, kBfloat16 = lowrankBfloat16;

// Buffers are distinct addresses; keys are in-place float32 sums unless told.
char arena[64];
CallKey key(int buf, size_t count = 1 << 20, int dtype = kFloat32, int op = kSum, bool inPlace = true) {
  return CallKey{arena + buf, inPlace, count, dtype, op};
}

// Runs a sequence; returns one char per call: 'C' given to lowrank, '.' to the real NCCL.
std::string run(SequencePolicy& p, const std::vector<CallKey>& calls,
                std::vector<SequencePolicy::Decision>* out = nullptr) {
  std::string s;
  for (const CallKey& k : calls) {
    SequencePolicy::Decision d = p.next(k);
    s += d.compress ? 'C' : '.';
    if (out) out->push_back(d);
  }
  return s;
}

std::vector<CallKey> repeat(const std::vector<CallKey>& cycle, int times) {
  std::vector<CallKey> v;
  for (int i = 0; i < times; ++i) v.insert(v.end(), cycle.begin(), cycle.end());
  return v;
}

bool contains(const std::vector<const void*>& v, int buf) {
  return std::find(v.begin(), v.end(), arena + buf) != v.end();
}

}  // namespace

TEST(ShimEligible, DtypeAndSize) {
  EXPECT_TRUE(eligible(kFloat32, 1 << 18, 1 << 20));        // exactly 1 MiB
  EXPECT_FALSE(eligible(kFloat32, (1 << 18) - 1, 1 << 20)); // one element short
  EXPECT_TRUE(eligible(kFloat16, 1 << 19, 1 << 20));
  EXPECT_TRUE(eligible(kBfloat16, 1 << 19, 1 << 20));
  EXPECT_FALSE(eligible(kBfloat16, (1 << 19) - 1, 1 << 20));
  for (int dt : {0, 1, 2, 3, 4, 5, 8, 10, 11})  // ints, float64, fp8
    EXPECT_FALSE(eligible(dt, 1 << 24, 1 << 20)) << dt;
  EXPECT_TRUE(eligible(kFloat32, 1, 0));   // LOWRANK_MIN_BYTES=0: any size
  EXPECT_FALSE(eligible(kFloat32, 0, 0));  // but never an empty call
}

TEST(ShimOps, BuiltinAndPreMulSum) {
  EXPECT_EQ(mapOp(kSum, nullptr, 4), kSum);
  EXPECT_EQ(mapOp(kAvg, nullptr, 4), kAvg);
  for (int op : {1, 2, 3}) EXPECT_FALSE(mapOp(op, nullptr, 4)) << op;  // prod, max, min
  EXPECT_FALSE(mapOp(5, nullptr, 4));  // a custom op the shim has no record of (device scalar)

  PreMulSum p;
  auto setF32 = [&](float x) { p.dtype = kFloat32; std::memcpy(p.value, &x, 4); };
  setF32(1.0f);
  EXPECT_EQ(mapOp(5, &p, 4), kSum);
  setF32(0.25f);
  EXPECT_EQ(mapOp(5, &p, 4), kAvg);
  EXPECT_FALSE(mapOp(5, &p, 2));  // 1/4 is not the average of 2
  setF32(1.0f / 3);
  EXPECT_EQ(mapOp(5, &p, 3), kAvg);
  setF32(std::nextafter(1.0f / 3, 1.0f));  // one ulp off: another scalar
  EXPECT_FALSE(mapOp(5, &p, 3));
  setF32(2.0f);
  EXPECT_FALSE(mapOp(5, &p, 4));

  p.dtype = 8;  // float64
  double d = 1.0 / 6;
  std::memcpy(p.value, &d, 8);
  EXPECT_EQ(mapOp(5, &p, 6), kAvg);

  p.dtype = kFloat16;  // 1/3 in half: 0x3555
  uint16_t h = 0x3555;
  std::memcpy(p.value, &h, 2);
  EXPECT_NEAR(*preMulScalar(p), 1.0 / 3, 1e-3);
  EXPECT_EQ(mapOp(5, &p, 3), kAvg);
  h = 0x3556;
  std::memcpy(p.value, &h, 2);
  EXPECT_FALSE(mapOp(5, &p, 3));

  p.dtype = kBfloat16;  // 1/3 in bfloat16: 0x3eab
  uint16_t b = 0x3eab;
  std::memcpy(p.value, &b, 2);
  EXPECT_EQ(mapOp(5, &p, 3), kAvg);
  b = 0x3f80;  // 1.0
  std::memcpy(p.value, &b, 2);
  EXPECT_EQ(mapOp(5, &p, 3), kSum);

  p.dtype = 2;  // int32 scalars are not mapped
  EXPECT_FALSE(preMulScalar(p));
  EXPECT_FALSE(mapOp(5, &p, 1));
}

TEST(ShimSequence, GivesLowrankTheCycleAfterItRepeatedTwice) {
  static_assert(SequencePolicy::kRepeats == 2, "docs/nccl_shim.md: seen twice in a row");
  for (int len : {1, 3, 5}) {
    SequencePolicy p;
    std::vector<CallKey> cycle;
    for (int i = 0; i < len; ++i) cycle.push_back(key(i));
    std::vector<SequencePolicy::Decision> d;
    const std::string s = run(p, repeat(cycle, 6), &d);
    // The cycle is seen complete twice (through NCCL), then every call of it goes to lowrank.
    const std::string want = std::string(size_t(2 * len), '.') + std::string(size_t(4 * len), 'C');
    EXPECT_EQ(s, want) << "cycle of " << len;
    EXPECT_TRUE(d[size_t(2 * len)].started);
    EXPECT_EQ(std::count_if(d.begin(), d.end(), [](auto& x) { return x.started; }), 1);
    EXPECT_EQ(p.cycleLength(), size_t(len));
    EXPECT_TRUE(p.compressing());
  }
}

TEST(ShimSequence, AFirstRecurrenceIsNotEnough) {
  // a comes back (a candidate [a b c]), but the repetition breaks at e: nothing goes to lowrank.
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), c = key(2), e = key(3);
  std::vector<SequencePolicy::Decision> d;
  EXPECT_EQ(run(p, {a, b, c, a, b, e}, &d), "......");
  EXPECT_TRUE(d[5].changed);
  EXPECT_FALSE(p.compressing());
  EXPECT_EQ(p.statefulBuffers(), 0u);
}

TEST(ShimSequence, DdpFirstIterationDiffers) {
  // DDP: buckets are rebuilt after the first iteration (other counts); the rebuilt ones repeat.
  SequencePolicy p;
  std::vector<CallKey> calls = {key(0, 100), key(1, 200), key(2, 300)};  // iteration 0
  auto rest = repeat({key(3, 250), key(4, 350)}, 4);
  calls.insert(calls.end(), rest.begin(), rest.end());
  EXPECT_EQ(run(p, calls), "..." "...." "CCCC");
}

TEST(ShimSequence, OneOffStaysExactAndIsDetectedAgainKeepingState) {
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), x = key(9);
  EXPECT_EQ(run(p, repeat({a, b}, 4)), "....CCCC");
  EXPECT_EQ(p.statefulBuffers(), 2u);
  std::vector<SequencePolicy::Decision> d;
  std::vector<CallKey> calls = {x};
  auto after = repeat({a, b}, 5);
  calls.insert(calls.end(), after.begin(), after.end());
  // The one-off passes through; the cycle goes to NCCL again until it has repeated twice.
  const std::string s = run(p, calls, &d);
  EXPECT_EQ(s[0], '.');
  EXPECT_TRUE(d[0].changed);
  EXPECT_EQ(s.substr(1), std::string("....") + "CCCCCC");
  // Nothing was released: the same buffers come back between the same neighbours.
  for (const auto& dd : d) EXPECT_TRUE(dd.release.empty());
  EXPECT_EQ(p.statefulBuffers(), 2u);
}

TEST(ShimSequence, ChangedSequenceReleasesWhatItTouches) {
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), c = key(2), e = key(3);
  EXPECT_EQ(run(p, repeat({a, b, c, e}, 3)), "........CCCC");
  // b is dropped from the cycle and a new buffer x comes in after a: a's and c's neighbours
  // change, b is gone; e keeps its neighbours (c before, a after). The first a still matches the
  // old cycle; x breaks it, and the new cycle [c e a x] is compressed once it has repeated twice.
  const CallKey x = key(5);
  std::vector<SequencePolicy::Decision> d;
  const std::string s = run(p, repeat({a, x, c, e}, 3), &d);
  EXPECT_EQ(s, "C.....CCCCCC");
  EXPECT_TRUE(d[1].changed);
  std::vector<const void*> released;
  for (const auto& dd : d) released.insert(released.end(), dd.release.begin(), dd.release.end());
  EXPECT_TRUE(contains(released, 0));
  EXPECT_TRUE(contains(released, 1));
  EXPECT_TRUE(contains(released, 2));
  EXPECT_FALSE(contains(released, 3));
  EXPECT_EQ(released.size(), 3u);
  EXPECT_TRUE(d[6].started);
}

TEST(ShimSequence, ReorderedBuffersAreReleased) {
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), c = key(2);
  EXPECT_EQ(run(p, repeat({a, b, c}, 3)), "......CCC");
  std::vector<SequencePolicy::Decision> d;
  run(p, repeat({a, c, b}, 3), &d);  // the same buffers in another order: other buckets
  std::vector<const void*> released;
  for (const auto& dd : d) released.insert(released.end(), dd.release.begin(), dd.release.end());
  for (int buf : {0, 1, 2}) EXPECT_TRUE(contains(released, buf)) << buf;
}

TEST(ShimSequence, RotationKeepsState) {
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), c = key(2), x = key(8);
  EXPECT_EQ(run(p, repeat({a, b, c}, 3)), "......CCC");
  ASSERT_EQ(p.statefulBuffers(), 3u);
  // A one-off between b and c: detection restarts and settles on the rotation [c a b].
  std::vector<SequencePolicy::Decision> d;
  std::vector<CallKey> calls = {a, b, x, c};
  auto more = repeat({a, b, c}, 3);
  calls.insert(calls.end(), more.begin(), more.end());
  const std::string s = run(p, calls, &d);
  EXPECT_EQ(s.substr(0, 3), "CC.");
  EXPECT_EQ(s.substr(s.size() - 3), "CCC");
  for (const auto& dd : d) EXPECT_TRUE(dd.release.empty());
}

TEST(ShimSequence, AddressReusedUnderAnotherKeyIsReleased) {
  SequencePolicy p;
  EXPECT_EQ(run(p, repeat({key(0, 100), key(1, 100)}, 3)), "....CC");
  std::vector<SequencePolicy::Decision> d;
  run(p, {key(0, 64)}, &d);  // buffer 0 now holds another tensor
  EXPECT_TRUE(contains(d[0].release, 0));
  EXPECT_FALSE(d[0].compress);
  d.clear();
  run(p, {key(1, 100, kFloat32, kAvg)}, &d);  // same address and count, another op
  EXPECT_TRUE(contains(d[0].release, 1));
  d.clear();
  run(p, {key(1, 100, kFloat32, kSum, /*inPlace=*/false)}, &d);
  EXPECT_TRUE(d[0].release.empty());  // buffer 1 has no state any more
}

TEST(ShimSequence, BufferTwiceInACycleIsNotCompressed) {
  SequencePolicy p;
  const CallKey a = key(0), b = key(1), c = key(2);
  const std::string s = run(p, repeat({a, b, a, c}, 5));
  // The cycle is found at some rotation; once it is, a stays exact and b, c are compressed.
  const std::string tail = s.substr(s.size() - 4);
  EXPECT_EQ(tail, ".C.C");
}

TEST(ShimSequence, CycleLongerThanTheLimitIsNeverCompressed) {
  SequencePolicy p(/*maxCycle=*/8);
  std::vector<CallKey> ten;
  for (int i = 0; i < 10; ++i) ten.push_back(key(i));
  EXPECT_EQ(run(p, repeat(ten, 5)), std::string(50, '.'));
  // A short cycle after many calls (history trimmed several times) is still found.
  EXPECT_EQ(run(p, repeat({key(20), key(21)}, 3)), "....CC");
}

TEST(ShimSequence, LongRunStaysCompressed) {
  SequencePolicy p(16);
  std::vector<CallKey> cyc;
  for (int i = 0; i < 5; ++i) cyc.push_back(key(i, size_t(1000 + i)));
  const std::string s = run(p, repeat(cyc, 200));
  EXPECT_EQ(s, std::string(10, '.') + std::string(990, 'C'));
  EXPECT_EQ(p.statefulBuffers(), 5u);
}
