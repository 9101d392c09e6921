// A tensor declared again with another approximation rank (lowrankBufferSetTensors), comm ranks
// as threads: its residual is kept bit for bit and its warm-start Q keeps its columns, cut or
// grown with columns drawn from (seed, id, calls) (engine/rank_change.h); every comm rank
// switches alike, and ranks that declare different ranks are refused together; a checkpoint
// carries each tensor's k and restores into a declaration of another k; per-tensor treatment
// shows in lowrankBufferGetTensorRanks; lowrankStats_t.rankChanges counts declared changes only.
// The expected states are built here from a checkpoint taken before the change and the draw
// of engine/phases.h, then restored into a second communicator, whose next call must give the
// same bits as the live change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "engine/phases.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

using Bytes = std::vector<unsigned char>;

struct T {
  uint64_t id;
  std::vector<size_t> shape;
  size_t numel() const {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    return n;
  }
};
// The tensor whose rank changes (a), another compressed one (b) and a bias.
const std::vector<T> kTensors = {{11, {24, 40}}, {22, {16, 30}}, {33, {16}}};
const uint64_t kChanged = 11;
const int kDefault = 3, kSeed = 5;

lowrankConfig_t cfg(int startIter = 0) {
  lowrankConfig_t c = config(kDefault);
  c.seed = kSeed;
  c.startIter = startIter;
  return c;
}

using Outs = std::map<uint64_t, std::vector<float>>;  // id -> its output of one call

// Declares kTensors in `buf` with ranks[i] as tensor i's approxRank, and allreduces (avg) the
// gradients of call `call` on comm rank r. out: each tensor's output.
lowrankResult_t callAll(lowrankComm_t comm, int r, int call, const std::vector<int>& ranks,
                        std::vector<float>& buf, Outs* out = nullptr) {
  std::vector<lowrankTensor_t> d;
  std::vector<float> g;
  for (size_t i = 0; i < kTensors.size(); ++i) {
    const T& t = kTensors[i];
    lowrankTensor_t x{};
    x.id = t.id;
    x.ndims = int(t.shape.size());
    for (size_t j = 0; j < t.shape.size(); ++j) x.shape[j] = t.shape[j];
    x.approxRank = ranks[i];
    d.push_back(x);
    std::vector<float> v = gaussian(t.numel(), unsigned(t.id * 7919 + 1000 * call + r));
    g.insert(g.end(), v.begin(), v.end());
  }
  buf.resize(g.size());
  EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), int(d.size()), d.data()), lowrankSuccess);
  const lowrankResult_t res =
      lowrankAllReduce(g.data(), buf.data(), g.size(), lowrankFloat32, lowrankAvg, comm, nullptr);
  size_t off = 0;
  for (const T& t : kTensors) {
    if (out) (*out)[t.id].assign(buf.begin() + long(off), buf.begin() + long(off + t.numel()));
    off += t.numel();
  }
  return res;
}

// Ranks with the changed tensor at k, the others at the communicator's.
std::vector<int> ranksWith(int k) { return {k, LOWRANK_RANK_DEFAULT, LOWRANK_RANK_DEFAULT}; }

Bytes save(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  Bytes b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  return b;
}

lowrank::SavedTensors decoded(const Bytes& b) {
  lowrank::SavedTensors s;
  EXPECT_TRUE(lowrank::decode(b.data(), b.size(), &s).ok());
  return s;
}

lowrank::SavedTensor& entry(lowrank::SavedTensors& s, uint64_t id) {
  for (auto& t : s.tensors)
    if (t.id == id) return t;
  ADD_FAILURE() << "no saved tensor " << id;
  return s.tensors.front();
}

Bytes encoded(const lowrank::SavedTensors& s) {
  Bytes b(lowrank::encodedSize(s));
  lowrank::encode(s, b.data());
  return b;
}

// The changed tensor's fresh draw at rank k for the call after `calls` (what a first Q is drawn
// from: phases::drawNormal on the stream idStream(id, calls + 1)), k x cols floats.
std::vector<float> freshRows(int k, uint64_t calls) {
  lowrank::TensorPlan t;
  t.k = k;
  t.id = kChanged;
  t.view.rows = kTensors[0].shape[0];
  t.view.cols = kTensors[0].shape[1];
  t.view.valid = t.view.rows * t.view.cols;
  lowrank::EngineConfig ec;
  ec.seed = kSeed;
  std::vector<float> q(size_t(k) * t.view.cols);
  lowrank::phases::drawNormal(t, ec, lowrank::phases::idStream(kChanged, calls + 1), q.data());
  return q;
}

// What the changed tensor's state must be at the change: its saved residual, and Qt's rows
// (Q's columns) kept up to min(old, new), the rest from the fresh draw.
enum class Q { Kept, AllFresh };
lowrank::SavedTensors expectedAfter(lowrank::SavedTensors s, int kNew, Q how, bool zeroResidual) {
  lowrank::SavedTensor& t = entry(s, kChanged);
  const size_t cols = kTensors[0].shape[1];
  std::vector<float> q = freshRows(kNew, t.calls);
  if (how == Q::Kept) {
    const size_t kept = size_t(std::min(t.k, kNew)) * cols;
    std::copy(t.qt.begin(), t.qt.begin() + long(kept), q.begin());
  }
  t.k = kNew;
  t.qt = q;
  if (zeroResidual) std::fill(t.residual.begin(), t.residual.end(), 0.f);
  return s;
}

bool same(const Outs& a, const Outs& b) {
  for (const auto& kv : a)
    if (std::memcmp(kv.second.data(), b.at(kv.first).data(), kv.second.size() * 4)) return false;
  return true;
}

// One call after restoring `state` (comm rank r's) with the changed tensor at kNew: its outputs.
// Comm ranks as threads: every rank restores its own.
std::vector<Outs> callAfterRestore(int N, const std::vector<lowrank::SavedTensors>& state, int kNew,
                                   int call) {
  std::vector<Outs> outs(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    const Bytes b = encoded(state[r]);
    std::vector<float> buf, any(1);
    ASSERT_EQ(lowrankBufferRestoreState(comm, any.data(), b.data(), b.size()), lowrankSuccess)
        << lowrankGetLastError(comm);
    ASSERT_EQ(callAll(comm, r, call, ranksWith(kNew), buf, &outs[r]), lowrankSuccess)
        << lowrankGetLastError(comm);
  }, cfg());
  return outs;
}

class RankChange : public ::testing::TestWithParam<std::pair<int, int>> {};

// The residual is kept bit for bit and Q's columns are kept, cut or grown with the columns drawn
// from (seed, id, calls): the live change's next call equals a restore of exactly that state.
TEST_P(RankChange, KeepsTheResidualAndQsColumns) {
  const int N = 2, first = 3;
  const auto [kOld, kNew] = GetParam();
  std::vector<lowrank::SavedTensors> before(N), after(N);
  std::vector<Outs> live(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < first; ++t)
      ASSERT_EQ(callAll(comm, r, t, ranksWith(kOld), buf), lowrankSuccess);
    before[r] = decoded(save(comm, buf.data()));
    ASSERT_EQ(callAll(comm, r, first, ranksWith(kNew), buf, &live[r]), lowrankSuccess)
        << lowrankGetLastError(comm);
    after[r] = decoded(save(comm, buf.data()));
  }, cfg());
  for (int r = 0; r < N; ++r) {
    // Format 2 carries each tensor's k.
    ASSERT_EQ(entry(before[r], kChanged).k, kOld == LOWRANK_RANK_DEFAULT ? kDefault : kOld);
    ASSERT_TRUE(entry(before[r], kChanged).haveQ);
    EXPECT_EQ(entry(after[r], kChanged).k, kNew);
    EXPECT_EQ(entry(after[r], kChanged).qt.size(), size_t(kNew) * kTensors[0].shape[1]);
  }
  auto expected = [&](Q how, bool zero) {
    std::vector<lowrank::SavedTensors> s(N);
    for (int r = 0; r < N; ++r) s[r] = expectedAfter(before[r], kNew, how, zero);
    return callAfterRestore(N, s, kNew, first);
  };
  const std::vector<Outs> want = expected(Q::Kept, false);
  for (int r = 0; r < N; ++r) EXPECT_TRUE(same(live[r], want[r])) << "comm rank " << r;
  // The test tells the alternatives apart: a residual dropped, or a Q drawn afresh.
  const std::vector<Outs> noResidual = expected(Q::Kept, true), freshQ = expected(Q::AllFresh, false);
  EXPECT_NE(live[0].at(kChanged), noResidual[0].at(kChanged));
  EXPECT_NE(live[0].at(kChanged), freshQ[0].at(kChanged));
  // The other tensors went on untouched: their outputs equal a run that never changed a rank.
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    Outs o;
    for (int t = 0; t <= first; ++t)
      ASSERT_EQ(callAll(comm, r, t, ranksWith(kOld), buf, &o), lowrankSuccess);
    EXPECT_EQ(o.at(22), live[r].at(22));
    EXPECT_EQ(o.at(33), live[r].at(33));
  }, cfg());
}

INSTANTIATE_TEST_SUITE_P(GrowAndCut, RankChange,
                         ::testing::Values(std::make_pair(2, 5), std::make_pair(5, 2),
                                           std::make_pair(LOWRANK_RANK_DEFAULT, 1)));

std::vector<int> tensorRanks(lowrankComm_t comm, const void* buf) {
  int n = 0;
  EXPECT_EQ(lowrankBufferGetTensorRanks(comm, buf, &n, nullptr), lowrankSuccess);
  std::vector<int> k(size_t(n), -7);
  EXPECT_EQ(lowrankBufferGetTensorRanks(comm, buf, &n, k.data()), lowrankSuccess);
  return k;
}

// Every comm rank declaring the same change switches at the same call to the same k: the outputs
// stay identical across ranks, each rank's plan shows the new k and counts one change.
TEST(RankChangeAcrossRanks, TheSameChangeSwitchesEveryRankAlike) {
  const int N = 3, calls = 6, at = 3, kNew = 6;
  std::vector<std::vector<Outs>> outs(N, std::vector<Outs>(calls));
  std::vector<std::vector<int>> shown(N);
  std::vector<uint64_t> changes(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t)
      ASSERT_EQ(callAll(comm, r, t, ranksWith(t < at ? 2 : kNew), buf, &outs[r][t]), lowrankSuccess)
          << lowrankGetLastError(comm);
    shown[r] = tensorRanks(comm, buf.data());
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    changes[r] = st.rankChanges;
  }, cfg());
  for (int r = 0; r < N; ++r) {
    for (int t = 0; t < calls; ++t)
      EXPECT_TRUE(same(outs[r][t], outs[0][t])) << "comm rank " << r << " call " << t;
    EXPECT_EQ(shown[r], (std::vector<int>{kNew, kDefault, 0})) << "comm rank " << r;
    EXPECT_EQ(changes[r], 1u) << "comm rank " << r;
  }
}

// Comm ranks declaring different ranks for a tensor are refused at that call, every one of them
// (the plan check covers each tensor's rank), and nothing changes: declared alike, they go on.
TEST(RankChangeAcrossRanks, DifferentChangesAreRefusedOnEveryRank) {
  const int N = 3;
  std::vector<lowrankResult_t> res(N);
  std::vector<std::vector<int>> shown(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < 2; ++t) ASSERT_EQ(callAll(comm, r, t, ranksWith(2), buf), lowrankSuccess);
    res[r] = callAll(comm, r, 2, ranksWith(r == 1 ? 5 : 4), buf);
    shown[r] = tensorRanks(comm, buf.data());
    EXPECT_EQ(callAll(comm, r, 2, ranksWith(4), buf), lowrankSuccess) << lowrankGetLastError(comm);
  }, cfg());
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(res[r], lowrankInvalidUsage) << "comm rank " << r;
    EXPECT_EQ(shown[r], (std::vector<int>{2, kDefault, 0})) << "comm rank " << r;  // unchanged
  }
}

// A checkpoint saved at one k restores into a declaration of another: the calls after it equal
// those of the run that changed k live, bit for bit (world 2).
TEST(RankChangeCheckpoint, RestoresAcrossAChangeOfK) {
  const int N = 2, first = 3, calls = 6, kOld = 2, kNew = 4;
  std::vector<std::vector<Outs>> live(N, std::vector<Outs>(calls));
  std::vector<Bytes> saved(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t) {
      ASSERT_EQ(callAll(comm, r, t, ranksWith(t < first ? kOld : kNew), buf, &live[r][t]),
                lowrankSuccess);
      if (t == first - 1) saved[r] = save(comm, buf.data());
    }
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf, any(1);
    ASSERT_EQ(lowrankBufferRestoreState(comm, any.data(), saved[r].data(), saved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    for (int t = first; t < calls; ++t) {
      Outs o;
      ASSERT_EQ(callAll(comm, r, t, ranksWith(kNew), buf, &o), lowrankSuccess)
          << lowrankGetLastError(comm);
      EXPECT_TRUE(same(o, live[r][t])) << "comm rank " << r << " call " << t;
    }
    lowrank::SavedTensors s = decoded(save(comm, buf.data()));
    EXPECT_EQ(entry(s, kChanged).k, kNew);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.rankChanges, 0u);  // a restore is no declared change
  }, cfg());
}

// Per-tensor treatment reaches the plan: exact, a rank of its own, the default; during the
// warm-up every tensor shows 0 (exact), after it its own k.
TEST(TensorRanks, ShowEachTensorsTreatment) {
  const int start = 2;
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    const std::vector<int> decl = {LOWRANK_RANK_EXACT, 2, LOWRANK_RANK_DEFAULT};
    for (int t = 0; t < start; ++t) {
      ASSERT_EQ(callAll(comm, r, t, decl, buf), lowrankSuccess);
      EXPECT_EQ(tensorRanks(comm, buf.data()), (std::vector<int>{0, 0, 0})) << "call " << t;
    }
    ASSERT_EQ(callAll(comm, r, start, decl, buf), lowrankSuccess);
    EXPECT_EQ(tensorRanks(comm, buf.data()), (std::vector<int>{0, 2, 0}));
    ASSERT_EQ(callAll(comm, r, start + 1, {kDefault + 1, LOWRANK_RANK_EXACT, 5}, buf),
              lowrankSuccess);
    EXPECT_EQ(tensorRanks(comm, buf.data()), (std::vector<int>{kDefault + 1, 0, 0}));
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.ncompressed, 1);

    // The count alone, room too small, nulls, a buffer without a plan.
    int n = 0, k[3] = {-7, -7, -7};
    ASSERT_EQ(lowrankBufferGetTensorRanks(comm, buf.data(), &n, nullptr), lowrankSuccess);
    EXPECT_EQ(n, 3);
    n = 2;
    EXPECT_EQ(lowrankBufferGetTensorRanks(comm, buf.data(), &n, k), lowrankInvalidArgument);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(k[0], -7);  // nothing written
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("3 tensors, room for 2"),
              std::string::npos) << lowrankGetLastError(comm);
    EXPECT_EQ(lowrankBufferGetTensorRanks(nullptr, buf.data(), &n, k), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferGetTensorRanks(comm, nullptr, &n, k), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferGetTensorRanks(comm, buf.data(), nullptr, k), lowrankInvalidArgument);
    float other[4];
    n = 3;
    ASSERT_EQ(lowrankBufferGetTensorRanks(comm, other, &n, k), lowrankSuccess);
    EXPECT_EQ(n, 0);
  }, cfg(start));
}

// rankChanges counts a tensor declared with another k than its state was planned with, once;
// not the same k spelled otherwise (the default, or the default's value), a declaration repeated,
// nor the end of a warm-up.
TEST(RankChangeStats, CountsDeclaredChangesOnly) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    auto changes = [&] {
      lowrankStats_t st;
      EXPECT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
      return st.rankChanges;
    };
    int call = 0;
    auto step = [&](const std::vector<int>& ranks) {
      ASSERT_EQ(callAll(comm, r, call++, ranks, buf), lowrankSuccess) << lowrankGetLastError(comm);
    };
    step(ranksWith(LOWRANK_RANK_DEFAULT));  // warm-up (startIter 1), then compressed: no change
    step(ranksWith(LOWRANK_RANK_DEFAULT));
    EXPECT_EQ(changes(), 0u);
    step(ranksWith(kDefault));  // the default's own value
    EXPECT_EQ(changes(), 0u);
    step(ranksWith(kDefault + 2));
    step(ranksWith(kDefault + 2));  // repeated
    EXPECT_EQ(changes(), 1u);
    step({LOWRANK_RANK_EXACT, 1, LOWRANK_RANK_DEFAULT});  // two tensors at once
    EXPECT_EQ(changes(), 3u);
  }, cfg(1));
}

}  // namespace
