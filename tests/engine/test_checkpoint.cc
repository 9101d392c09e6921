// Checkpoint of a buffer's state (lowrankBufferSaveState / lowrankBufferRestoreState), comm ranks as
// threads: a run saved, torn down and restored into a new communicator goes on bit for bit as the
// run that never stopped; restores that do not fit are refused, on every comm rank where the
// mismatch is across ranks; bad bytes change nothing. Processes: tests/multiprocess; device
// buffers: tests/gpu (emulated).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

using Bytes = std::vector<unsigned char>;

struct Case {
  const char* name;
  bool perTensor;
  int warmStart;
  int startIter;
  int alternate = 0;  // alternating PowerSGD; with first odd, the restored call is a Q step
  int first = 20;     // calls before the save
};

// Two matrices and a bias (per-tensor), or the same count as one matrix (batched).
constexpr size_t kN0 = 24, kM0 = 40, kN1 = 16, kM1 = 30, kBias = 16;
constexpr size_t kCount = kN0 * kM0 + kN1 * kM1 + kBias;

void setLayout(lowrankComm_t comm, const void* buf) {
  const size_t s0[] = {kN0, kM0}, s1[] = {kN1, kM1}, s2[] = {kBias};
  const size_t* shapes[] = {s0, s1, s2};
  const int ndims[] = {2, 2, 1};
  ASSERT_EQ(lowrankBufferSetLayout(comm, buf, 3, ndims, shapes), lowrankSuccess);
}

std::vector<float> input(int rank, int call) { return gaussian(kCount, 1000u * call + rank); }

lowrankResult_t restore(lowrankComm_t comm, const std::vector<float>& buf, const Bytes& b) {
  return lowrankBufferRestoreState(comm, buf.data(), b.data(), b.size());
}

// One call on buf, of rank's input for call number `call`.
lowrankResult_t callOnce(lowrankComm_t comm, int rank, std::vector<float>& buf, int call) {
  const std::vector<float> g = input(rank, call);
  return lowrankAllReduce(g.data(), buf.data(), kCount, lowrankFloat32, lowrankAvg, comm, nullptr);
}

// Calls [from, to) on buf, each output appended to outs.
void calls(lowrankComm_t comm, int rank, std::vector<float>& buf, int from, int to,
           std::vector<std::vector<float>>* outs) {
  for (int t = from; t < to; ++t) {
    ASSERT_EQ(callOnce(comm, rank, buf, t), lowrankSuccess) << lowrankGetLastError(comm);
    if (outs) outs->push_back(buf);
  }
}

Bytes save(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  Bytes b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  EXPECT_EQ(size, b.size());
  return b;
}

lowrankConfig_t cfgOf(const Case& c, int k = 3) {
  lowrankConfig_t cfg = config(k);
  cfg.warmStart = c.warmStart;
  cfg.startIter = c.startIter;
  cfg.alternate = c.alternate;
  cfg.seed = 11;
  return cfg;
}

class Resume : public ::testing::TestWithParam<Case> {};

// 20 calls, save on every rank, destroy, new communicator, restore, 20 more: outputs equal the
// uninterrupted run's bit for bit, on every comm rank.
TEST_P(Resume, NextCallsBitIdenticalOnEveryRank) {
  const Case c = GetParam();
  const int N = 3, first = c.first, total = 40;
  const lowrankConfig_t cfg = cfgOf(c);
  std::vector<std::vector<std::vector<float>>> straight(N), resumed(N);
  std::vector<Bytes> saved(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    if (c.perTensor) setLayout(comm, buf.data());
    calls(comm, r, buf, 0, total, &straight[r]);
  }, cfg);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    if (c.perTensor) setLayout(comm, buf.data());
    calls(comm, r, buf, 0, first, nullptr);
    saved[r] = save(comm, buf.data());
  }, cfg);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);  // another address, another communicator: nothing carried over
    // Restore first, then the layout (either order works; the layout keeps the restore pending).
    ASSERT_EQ(restore(comm, buf, saved[r]), lowrankSuccess) << lowrankGetLastError(comm);
    if (c.perTensor) setLayout(comm, buf.data());
    // A restore not yet called saves what was restored.
    EXPECT_EQ(save(comm, buf.data()), saved[r]);
    calls(comm, r, buf, first, total, &resumed[r]);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.calls, size_t(total));
  }, cfg);
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(resumed[r].size(), size_t(total - first));
    for (int t = first; t < total; ++t)
      ASSERT_EQ(0, std::memcmp(resumed[r][t - first].data(), straight[r][t].data(),
                               kCount * sizeof(float)))
          << "rank " << r << " call " << t;
  }
  // The restored run is not trivially the fresh one: a fresh buffer's 21st output differs.
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    std::vector<std::vector<float>> fresh;
    if (c.perTensor) setLayout(comm, buf.data());
    calls(comm, r, buf, first, first + 1, &fresh);
    if (c.startIter < first) {
      EXPECT_NE(fresh[0], straight[r][first]);
    }
  }, cfg);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, Resume,
                         ::testing::Values(Case{"per_tensor", true, 1, 0},
                                           Case{"batched", false, 1, 0},
                                           Case{"no_warm_start", true, 0, 0},
                                           Case{"in_warm_up", true, 1, 25},
                                           Case{"alternate_at_p_step", true, 1, 0, 1, 20},
                                           Case{"alternate_at_q_step", true, 1, 0, 1, 21},
                                           Case{"alternate_batched_at_q_step", false, 1, 0, 1, 21}),
                         [](const auto& info) { return std::string(info.param.name); });

// The bytes of a 2-rank run with k = 3, per tensor, 5 calls: rank r's in out[r].
std::vector<Bytes> savedRun(int N, int k) {
  std::vector<Bytes> out(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 5, nullptr);
    out[r] = save(comm, buf.data());
  }, cfgOf(Case{"", true, 1, 0}, k));
  return out;
}

TEST(Checkpoint, AnotherWorldSizeIsRefusedNamingItAndAnotherKCarriesOver) {
  const std::vector<Bytes> two = savedRun(2, 3);
  withComms(3, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    const Bytes& b = two[r % 2];
    EXPECT_EQ(restore(comm, buf, b), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("comm size 2"), std::string::npos)
        << lowrankGetLastError(comm);
  }, cfgOf(Case{"", true, 1, 0}));
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    // Another comm rank's bytes: refused (each rank's residual is its own); nothing was staged.
    EXPECT_EQ(restore(comm, buf, two[1 - r]), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("comm rank"), std::string::npos);
    size_t size = 0;
    EXPECT_EQ(lowrankBufferSaveState(comm, buf.data(), nullptr, &size), lowrankInvalidUsage);
    // Its own, saved at k = 3, into k = 2: every tensor goes on at the communicator's k, as a
    // declared tensor restored at another rank does (rank_change.h: its Q's first 2 columns).
    setLayout(comm, buf.data());
    ASSERT_EQ(restore(comm, buf, two[r]), lowrankSuccess);
    ASSERT_EQ(callOnce(comm, r, buf, 5), lowrankSuccess) << lowrankGetLastError(comm);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.approxRank, 2);
    EXPECT_EQ(v.calls, 6u);  // the saved 5, and this one
  }, cfgOf(Case{"", true, 1, 0}, 2));
}

TEST(Checkpoint, RestoreOnOneRankOnlyIsRefusedOnEveryRank) {
  const std::vector<Bytes> saved = savedRun(2, 3);
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    if (r == 0) {
      ASSERT_EQ(restore(comm, buf, saved[r]), lowrankSuccess);
    }
    EXPECT_EQ(callOnce(comm, r, buf, 5), lowrankInvalidUsage);
    const std::string msg = lowrankGetLastError(comm);
    EXPECT_NE(msg.find("restored state"), std::string::npos) << msg;
    EXPECT_NE(msg.find(r == 0 ? "restored the state of call 5" : "restored none"),
              std::string::npos) << msg;
    // Found at plan time on every rank: the communicator stays usable. Dropping the restore
    // (or making it on every rank) lets the buffer go on.
    if (r == 0) {
      ASSERT_EQ(lowrankBufferReset(comm, buf.data()), lowrankSuccess);
    }
    EXPECT_EQ(callOnce(comm, r, buf, 5), lowrankSuccess) << lowrankGetLastError(comm);
  }, cfgOf(Case{"", true, 1, 0}));
}

// Into a buffer the peers have planned, a restore on one comm rank makes that rank plan again
// while its peers make the call: the collectives differ, every rank fails (no hang), and the
// restoring rank's error says why.
TEST(Checkpoint, RestoreOnOneRankIntoAPlannedBufferFailsEveryRankNamingTheRestore) {
  const std::vector<Bytes> saved = savedRun(2, 3);
  lowrankConfig_t cfg = cfgOf(Case{"", true, 1, 0});
  cfg.timeoutSec = 10;
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 2, nullptr);
    if (r == 0) {
      ASSERT_EQ(restore(comm, buf, saved[r]), lowrankSuccess);
    }
    EXPECT_NE(callOnce(comm, r, buf, 2), lowrankSuccess);
    if (r == 0) {
      EXPECT_NE(std::string(lowrankGetLastError(comm)).find("restore on every comm rank"),
                std::string::npos) << lowrankGetLastError(comm);
    }
  }, cfg);
}

// As above, with a tensor whose whole compressed payload (P of 8 x 1 and the two checks: 10
// floats) has the byte size of the plan check's 5 words: the collectives must still be told apart
// (the plan check travels as 41 bytes, a size no float32 payload has), not reduced together.
TEST(Checkpoint, RestoreOnOneRankIsFoundWhenThePayloadHasThePlanChecksWordSize) {
  constexpr size_t kN = 8, kM = 40;
  lowrankConfig_t cfg = config(1);
  cfg.timeoutSec = 10;
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kN * kM);
    const size_t shape[] = {kN, kM};
    const size_t* shapes[] = {shape};
    const int ndims[] = {2};
    ASSERT_EQ(lowrankBufferSetLayout(comm, buf.data(), 1, ndims, shapes), lowrankSuccess);
    auto call = [&](int t) {
      const std::vector<float> g = gaussian(kN * kM, 100u * t + r);
      return lowrankAllReduce(g.data(), buf.data(), kN * kM, lowrankFloat32, lowrankSum, comm,
                              nullptr);
    };
    ASSERT_EQ(call(0), lowrankSuccess) << lowrankGetLastError(comm);
    lowrankBufferView_t view{};
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &view), lowrankSuccess);
    ASSERT_EQ(view.pElements + 2 + view.exactElements, size_t(10));  // 40 bytes on the wire
    const Bytes b = save(comm, buf.data());
    ASSERT_EQ(call(1), lowrankSuccess) << lowrankGetLastError(comm);
    if (r == 0) {
      ASSERT_EQ(restore(comm, buf, b), lowrankSuccess);
    }
    EXPECT_NE(call(2), lowrankSuccess) << "comm rank " << r;
    const std::string err = lowrankGetLastError(comm);
    if (r == 0) {
      EXPECT_NE(err.find("restore on every comm rank"), std::string::npos) << err;
    } else {
      // The size mismatch, named: 41 bytes met 40 (UCX's truncation of the receive; the message's
      // index depends on the algorithm the cost model chose).
      EXPECT_NE(err.find("receive from comm rank 0 (message "), std::string::npos) << err;
      EXPECT_NE(err.find(") failed: Message truncated"), std::string::npos) << err;
    }
  }, cfg);
}

TEST(Checkpoint, RestoresFromDifferentStepsAreRefusedOnEveryRank) {
  std::vector<Bytes> at5(2), at6(2);
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 5, nullptr);
    at5[r] = save(comm, buf.data());
    calls(comm, r, buf, 5, 6, nullptr);
    at6[r] = save(comm, buf.data());
  }, cfgOf(Case{"", true, 1, 0}));
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    const Bytes& b = r == 0 ? at5[r] : at6[r];
    ASSERT_EQ(restore(comm, buf, b), lowrankSuccess);
    EXPECT_EQ(callOnce(comm, r, buf, 6), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("disagree on its restored state"),
              std::string::npos);
  }, cfgOf(Case{"", true, 1, 0}));
}

TEST(Checkpoint, CallThatDoesNotFitIsRefusedOnEveryRankNamingIt) {
  const std::vector<Bytes> saved = savedRun(2, 3);
  withComms(2, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    ASSERT_EQ(restore(comm, buf, saved[r]), lowrankSuccess);
    // No layout set here (batched), the state was saved per tensor: refused when planned.
    EXPECT_EQ(callOnce(comm, r, buf, 5), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("layout"), std::string::npos)
        << lowrankGetLastError(comm);
    // On a planned buffer the same mismatch is refused by the restore itself, which then changes
    // nothing: the buffer's state can still be saved, as it was.
    ASSERT_EQ(lowrankBufferReset(comm, buf.data()), lowrankSuccess);
    calls(comm, r, buf, 5, 6, nullptr);
    const Bytes before = save(comm, buf.data());
    EXPECT_EQ(restore(comm, buf, saved[r]), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("layout 3 tensors [(24,40), (16,30), "
                                                          "(16)], this buffer has batched"),
              std::string::npos) << lowrankGetLastError(comm);
    EXPECT_EQ(save(comm, buf.data()), before);
  }, cfgOf(Case{"", true, 1, 0}));
}

// Truncated, corrupt and foreign bytes: lowrankInvalidArgument, and the buffer goes on as if the
// restore had never been tried (never half restored).
TEST(Checkpoint, BadBytesAreRefusedAndChangeNothing) {
  const int N = 2;
  const lowrankConfig_t cfg = cfgOf(Case{"", true, 1, 0});
  std::vector<std::vector<std::vector<float>>> straight(N), tried(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 10, &straight[r]);
  }, cfg);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 5, nullptr);
    const Bytes good = save(comm, buf.data());
    auto refused = [&](const Bytes& b, const char* why) {
      EXPECT_EQ(restore(comm, buf, b), lowrankInvalidArgument) << why;
      EXPECT_NE(std::string(lowrankGetLastError(comm)).find(why), std::string::npos)
          << lowrankGetLastError(comm);
    };
    refused(Bytes(good.begin(), good.end() - 1), "CRC");
    refused(Bytes(good.begin(), good.begin() + 40), "truncated");
    Bytes flipped = good;
    flipped[good.size() / 2] ^= 4;
    refused(flipped, "CRC");
    Bytes foreign(good.size(), 'x');
    refused(foreign, "not lowrank's");
    Bytes version = good;
    version[8] = 9;
    refused(version, "CRC");  // a changed version field alone: corrupt bytes
    const uint32_t c = uint32_t(crc32(0L, version.data(), uInt(version.size() - 4)));
    for (int i = 0; i < 4; ++i) version[version.size() - 4 + i] = uint8_t(c >> (8 * i));
    refused(version, "format version 9");  // whole bytes of another format
    EXPECT_EQ(lowrankBufferRestoreState(comm, buf.data(), nullptr, 10), lowrankInvalidArgument);
    // A good restore that does not fit the planned buffer (another count: another layout)
    // changes nothing either.
    calls(comm, r, buf, 5, 10, &tried[r]);
  }, cfg);
  for (int r = 0; r < N; ++r)
    for (int t = 5; t < 10; ++t)
      ASSERT_EQ(tried[r][t - 5], straight[r][t]) << "rank " << r << " call " << t;
}

TEST(Checkpoint, SaveSizesAndErrors) {
  withComms(2, [&](int r, lowrankComm_t comm) {
    (void)r;
    std::vector<float> buf(kCount), never(kCount);
    setLayout(comm, buf.data());
    size_t size = 0;
    EXPECT_EQ(lowrankBufferSaveState(comm, never.data(), nullptr, &size), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("no state to save"), std::string::npos);
    calls(comm, r, buf, 0, 2, nullptr);
    ASSERT_EQ(lowrankBufferSaveState(comm, buf.data(), nullptr, &size), lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    // Format 2: header (40) + per tensor id, ndims, k, calls, flags, two sizes (44) and its
    // sizes (2 x 16 + 8) + residual + Q + CRC.
    EXPECT_EQ(size, 40 + 3 * 44 + 40 + 4 * (kCount + v.qElements) + 4);
    Bytes small(size - 1, 0xab);
    size_t have = small.size();
    EXPECT_EQ(lowrankBufferSaveState(comm, buf.data(), small.data(), &have), lowrankInvalidArgument);
    EXPECT_EQ(have, size);
    EXPECT_EQ(small, Bytes(size - 1, 0xab));  // nothing written
    EXPECT_EQ(lowrankBufferSaveState(comm, buf.data(), small.data(), nullptr), lowrankInvalidArgument);
    // Saving changes nothing: two saves in a row are equal.
    EXPECT_EQ(save(comm, buf.data()), save(comm, buf.data()));
    // A reset drops the state: nothing to save.
    ASSERT_EQ(lowrankBufferReset(comm, buf.data()), lowrankSuccess);
    EXPECT_EQ(lowrankBufferSaveState(comm, buf.data(), nullptr, &size), lowrankInvalidUsage);
  });
}

uint64_t u64At(const Bytes& b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(b[at + i]) << (8 * i);
  return v;
}

// lowrankStateAddCalls (the conversion of lowrank.torch's version-1 checkpoints): format-1 bytes
// with more calls counted, every other byte as saved, a CRC that holds; restored into a
// communicator whose warm-up (startIter) is those calls, the buffer goes on compressed exactly as
// the run without a warm-up did (the old hook's warm-up was its own). Bad bytes change nothing.
// Bytes by position (what lowrank writes for a buffer without ids) as format 1, what lowrank
// wrote for it before: the same state, through the library's own format-1 encoder.
Bytes asFormat1(const Bytes& b, int k) {
  lowrank::SavedTensors t;
  EXPECT_TRUE(lowrank::decode(b.data(), b.size(), &t).ok());
  lowrank::SavedState s;
  s.dtype = lowrankFloat32;
  s.layout = lowrank::Layout{};
  s.approxRank = k;
  s.seed = t.seed;
  s.nranks = t.nranks;
  s.rank = t.rank;
  s.errorFeedback = t.errorFeedback;
  for (const lowrank::SavedTensor& x : t.tensors) {
    s.layout->push_back(x.shape);
    size_t numel = 1;
    for (size_t d : x.shape) numel *= d;
    s.count += numel;
    s.calls = x.calls;
    s.haveQ = s.haveQ || x.haveQ;
    s.residual.insert(s.residual.end(), x.residual.begin(), x.residual.end());
    s.qt.insert(s.qt.end(), x.qt.begin(), x.qt.end());
  }
  Bytes out(lowrank::encodedSize(s));
  lowrank::encode(s, out.data());
  return out;
}

TEST(Checkpoint, AddCallsToFormat1) {
  const int N = 2, warmup = 7;
  const lowrankConfig_t cfg = cfgOf(Case{"", true, 1, 0});
  lowrankConfig_t later = cfg;  // the restart's warm-up, counted by the library
  later.startIter = warmup;
  std::vector<std::vector<std::vector<float>>> straight(N), resumed(N), unconverted(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf(kCount);
    setLayout(comm, buf.data());
    calls(comm, r, buf, 0, 8, &straight[r]);
  }, cfg);
  std::vector<Bytes> saved = savedRun(N, 3);  // after 5 calls, as cfg
  for (Bytes& b : saved) b = asFormat1(b, 3);
  std::vector<Bytes> converted = saved;
  for (int r = 0; r < N; ++r) {
    Bytes& c = converted[r];
    ASSERT_EQ(lowrankStateAddCalls(c.data(), c.size(), warmup), lowrankSuccess)
        << lowrankGetLastError(nullptr);
    ASSERT_EQ(c.size(), saved[r].size());
    EXPECT_EQ(u64At(saved[r], 48), 5u);
    EXPECT_EQ(u64At(c, 48), 5u + warmup);
    EXPECT_TRUE(std::equal(c.begin(), c.begin() + 48, saved[r].begin()));
    EXPECT_TRUE(std::equal(c.begin() + 56, c.end() - 4, saved[r].begin() + 56));
    const uint32_t crc = uint32_t(crc32(0L, c.data(), uInt(c.size() - 4)));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(c[c.size() - 4 + i], uint8_t(crc >> (8 * i)));
  }
  for (auto* out : {&resumed, &unconverted})
    withComms(N, [&](int r, lowrankComm_t comm) {
      std::vector<float> buf(kCount);
      setLayout(comm, buf.data());
      ASSERT_EQ(restore(comm, buf, out == &resumed ? converted[r] : saved[r]), lowrankSuccess)
          << lowrankGetLastError(comm);
      calls(comm, r, buf, 5, 8, &(*out)[r]);
    }, later);
  for (int r = 0; r < N; ++r)
    for (int t = 5; t < 8; ++t)
      ASSERT_EQ(resumed[r][t - 5], straight[r][t]) << "rank " << r << " call " << t;
  // Without the conversion the buffer is in its warm-up again: call 5 is exact.
  EXPECT_NE(unconverted[0][0], straight[0][5]);

  auto refused = [](Bytes b, uint64_t calls, const char* why) {
    const Bytes before = b;
    EXPECT_EQ(lowrankStateAddCalls(b.data(), b.size(), calls), lowrankInvalidArgument) << why;
    EXPECT_NE(std::string(lowrankGetLastError(nullptr)).find(why), std::string::npos)
        << lowrankGetLastError(nullptr);
    EXPECT_EQ(b, before) << why;
  };
  const Bytes& good = saved[0];
  refused(Bytes(good.begin(), good.end() - 1), 1, "CRC");
  refused(Bytes(good.begin(), good.begin() + 40), 1, "truncated");
  refused(Bytes(good.size(), 'x'), 1, "not lowrank's");
  Bytes flipped = good;
  flipped[good.size() / 2] ^= 4;
  refused(flipped, 1, "CRC");
  Bytes v2 = good;  // whole bytes of another format version
  v2[8] = 2;
  const uint32_t c = uint32_t(crc32(0L, v2.data(), uInt(v2.size() - 4)));
  for (int i = 0; i < 4; ++i) v2[v2.size() - 4 + i] = uint8_t(c >> (8 * i));
  refused(v2, 1, "format version 2");
  refused(good, uint64_t(1) << 62, "2^62");
  EXPECT_EQ(lowrankStateAddCalls(nullptr, 10, 1), lowrankInvalidArgument);
}

}  // namespace
