// State keyed by tensor ids (lowrankBufferSetTensors), comm ranks as threads: the rules of
// lowrank.h and docs/api.md ("Tensor ids"), each against a run that holds the answer: the same ids
// at a new address every call, in another grouping, or restored into another bucketing give the
// outputs of the run that never moved them, bit for bit at world 2 (a sum of two is exact in any
// order); a moved id makes its old buffer's call lowrankInvalidUsage naming it; the first Q follows
// the id; warm-up is counted per id; bytes saved by a buffer without ids (by position) restore into a
// buffer with ids (format 1's: tests/engine/fixtures).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data.h"
#include "support/ranks.h"

using namespace lowrank::testing;

namespace {

using Bytes = std::vector<unsigned char>;

// Three tensors: two matrices and a bias, ids 101, 202, 303.
struct T {
  uint64_t id;
  std::vector<size_t> shape;
  size_t numel() const {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    return n;
  }
};
const std::vector<T> kTensors = {{101, {24, 40}}, {202, {16, 30}}, {303, {16}}};

lowrankTensor_t desc(const T& t, int rank = LOWRANK_RANK_DEFAULT) {
  lowrankTensor_t d{};
  d.id = t.id;
  d.ndims = int(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) d.shape[i] = t.shape[i];
  d.approxRank = rank;
  return d;
}

// One tensor's gradient on comm rank r at call `call` (independent of where it is packed).
std::vector<float> grad(const T& t, int r, int call) {
  return gaussian(t.numel(), unsigned(t.id * 7919 + 1000 * call + r));
}

// A buffer of some tensors, in order: declares them, packs their gradients, calls, unpacks.
using Outs = std::map<uint64_t, std::vector<float>>;  // id -> its output of one call

lowrankResult_t callGroup(lowrankComm_t comm, int r, int call, const std::vector<T>& group,
                          std::vector<float>& buf, Outs* out, bool declare = true) {
  std::vector<lowrankTensor_t> d;
  size_t count = 0;
  for (const T& t : group) {
    d.push_back(desc(t));
    count += t.numel();
  }
  buf.assign(count, 0.f);
  if (declare) EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), int(d.size()), d.data()), lowrankSuccess);
  std::vector<float> g;
  for (const T& t : group) {
    std::vector<float> x = grad(t, r, call);
    g.insert(g.end(), x.begin(), x.end());
  }
  lowrankResult_t res =
      lowrankAllReduce(g.data(), buf.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr);
  size_t off = 0;
  for (const T& t : group) {
    if (out) (*out)[t.id].assign(buf.begin() + long(off), buf.begin() + long(off + t.numel()));
    off += t.numel();
  }
  return res;
}

lowrankConfig_t cfg(int startIter = 0) {
  lowrankConfig_t c = config(3);
  c.seed = 5;
  c.startIter = startIter;
  return c;
}

Bytes save(lowrankComm_t comm, const void* buf) {
  size_t size = 0;
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, nullptr, &size), lowrankSuccess)
      << lowrankGetLastError(comm);
  Bytes b(size);
  EXPECT_EQ(lowrankBufferSaveState(comm, buf, b.data(), &size), lowrankSuccess);
  return b;
}

// Every call's outputs (by id) of rank r, for a run of `calls` calls of all tensors in one buffer.
std::vector<std::vector<Outs>> straightRun(int N, int calls, lowrankConfig_t c = cfg()) {
  std::vector<std::vector<Outs>> outs(N, std::vector<Outs>(calls));
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t)
      ASSERT_EQ(callGroup(comm, r, t, kTensors, buf, &outs[r][t]), lowrankSuccess)
          << lowrankGetLastError(comm);
  }, c);
  return outs;
}

// A group's tensors as a layout of a buffer without ids (lowrankBufferSetLayout), and its count.
lowrankResult_t setLayoutOf(lowrankComm_t comm, const void* buf, const std::vector<T>& group) {
  std::vector<int> nd;
  std::vector<const size_t*> sh;
  for (const T& t : group) {
    nd.push_back(int(t.shape.size()));
    sh.push_back(t.shape.data());
  }
  return lowrankBufferSetLayout(comm, buf, int(nd.size()), nd.data(), sh.data());
}

size_t countOf(const std::vector<T>& group) {
  size_t n = 0;
  for (const T& t : group) n += t.numel();
  return n;
}

void expectSame(const Outs& a, const Outs& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& kv : a) {
    ASSERT_TRUE(b.count(kv.first)) << what;
    EXPECT_EQ(0, std::memcmp(kv.second.data(), b.at(kv.first).data(), kv.second.size() * 4))
        << what << ", tensor id " << kv.first;
  }
}

// A buffer without ids has synthetic ids, its tensors' positions, in a key space of its own: a
// caller's ids 0, 1, 2 on another buffer of the same shapes never meet them. Each buffer, called
// side by side with the other (and with a restore of the caller's ids staged meanwhile), gives the
// outputs it gives alone. If the key spaces were one, the declared buffer would take the anonymous
// one's record (or refuse it as moved) and the outputs would differ.
TEST(TensorIds, SyntheticIdsNeverMeetACallersIds) {
  const int N = 2, calls = 5;
  const std::vector<T> same = {{0, {24, 40}}, {1, {16, 30}}, {2, {16}}};  // ids = positions
  const size_t count = countOf(same);
  // Each buffer alone: the declared one's outputs by id, the anonymous one's whole.
  std::vector<std::vector<Outs>> declared(N, std::vector<Outs>(calls));
  std::vector<std::vector<std::vector<float>>> anon(N);
  auto anonCall = [&](lowrankComm_t comm, int r, int t, std::vector<float>& a) {
    std::vector<float> in;
    for (const T& x : same) { auto v = grad(x, r, t + 50); in.insert(in.end(), v.begin(), v.end()); }
    return lowrankAllReduce(in.data(), a.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr);
  };
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t)
      ASSERT_EQ(callGroup(comm, r, t, same, buf, &declared[r][t]), lowrankSuccess);
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> a(count);
    ASSERT_EQ(setLayoutOf(comm, a.data(), same), lowrankSuccess);
    for (int t = 0; t < calls; ++t) {
      ASSERT_EQ(anonCall(comm, r, t, a), lowrankSuccess);
      anon[r].push_back(a);
    }
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf, a(count);
    ASSERT_EQ(setLayoutOf(comm, a.data(), same), lowrankSuccess);
    for (int t = 0; t < calls; ++t) {
      if (t == 3) {  // the caller's ids' state saved and staged again: the anonymous buffer's
                     // next call must not take it
        const Bytes b = save(comm, buf.data());
        ASSERT_EQ(lowrankBufferRestoreState(comm, buf.data(), b.data(), b.size()), lowrankSuccess);
      }
      ASSERT_EQ(anonCall(comm, r, t, a), lowrankSuccess) << lowrankGetLastError(comm);
      EXPECT_EQ(0, std::memcmp(a.data(), anon[r][t].data(), 4 * count)) << "anonymous, call " << t;
      Outs got;
      ASSERT_EQ(callGroup(comm, r, t, same, buf, &got), lowrankSuccess) << lowrankGetLastError(comm);
      expectSame(got, declared[r][t], "declared, call " + std::to_string(t));
    }
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.buffers, 2u);  // two records: neither took the other's tensors
  }, cfg());
}

// FSDP's case: the same ids at a new address every call carry their state, as a stable buffer.
TEST(TensorIds, SameIdsAtANewAddressEveryCallAsAStableBuffer) {
  const int N = 2, calls = 6;
  auto straight = straightRun(N, calls);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<std::vector<float>> bufs(calls);  // all alive: every call's address differs
    for (int t = 0; t < calls; ++t) {
      Outs o;
      ASSERT_EQ(callGroup(comm, r, t, kTensors, bufs[t], &o), lowrankSuccess);
      expectSame(o, straight[r][t], "call " + std::to_string(t));
      lowrankBufferView_t v;
      ASSERT_EQ(lowrankBufferGetView(comm, bufs[t].data(), &v), lowrankSuccess);
      EXPECT_EQ(v.calls, size_t(t + 1));  // the record moved here with its count
      if (t) {
        ASSERT_EQ(lowrankBufferGetView(comm, bufs[t - 1].data(), &v), lowrankSuccess);
        EXPECT_EQ(v.planned, 0);  // the old address holds nothing now
      }
    }
    lowrankStats_t s;
    ASSERT_EQ(lowrankGetStats(comm, &s), lowrankSuccess);
    EXPECT_EQ(s.compressedCalls, uint64_t(calls));
  }, cfg());
}

// A bucket rebuild: after 3 calls the tensors go to two buffers in another order; each keeps its
// residual and warm start.
TEST(TensorIds, AnotherGroupingCarriesEachIdsState) {
  const int N = 2, calls = 6;
  auto straight = straightRun(N, calls);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> first, a, b;
    for (int t = 0; t < 3; ++t) ASSERT_EQ(callGroup(comm, r, t, kTensors, first, nullptr), lowrankSuccess);
    for (int t = 3; t < calls; ++t) {
      Outs o;
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[2], kTensors[0]}, a, &o), lowrankSuccess)
          << lowrankGetLastError(comm);
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[1]}, b, &o), lowrankSuccess);
      expectSame(o, straight[r][t], "call " + std::to_string(t));
    }
  }, cfg());
  // Not trivially so: the same ids afresh at call 3 give other outputs.
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> a;
    Outs o;
    ASSERT_EQ(callGroup(comm, r, 3, kTensors, a, &o), lowrankSuccess);
    EXPECT_NE(o.at(101), straight[r][3].at(101));
  }, cfg());
}

// At world >= 3 a sum's order depends on where a tensor sits in the buffer (the ring's blocks),
// so another grouping agrees to rounding only: within 1e-4 of the output's largest magnitude.
TEST(TensorIds, AnotherGroupingAtWorld3AgreesToRounding) {
  const int N = 3, calls = 6;
  auto straight = straightRun(N, calls);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> first, a, b;
    for (int t = 0; t < 3; ++t) ASSERT_EQ(callGroup(comm, r, t, kTensors, first, nullptr), lowrankSuccess);
    for (int t = 3; t < calls; ++t) {
      Outs o;
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[2], kTensors[0]}, a, &o), lowrankSuccess);
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[1]}, b, &o), lowrankSuccess);
      for (const auto& kv : o) {
        const std::vector<float>& want = straight[r][t].at(kv.first);
        float big = 0, diff = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          big = std::max(big, std::fabs(want[i]));
          diff = std::max(diff, std::fabs(want[i] - kv.second[i]));
        }
        EXPECT_LE(diff, 1e-4f * big) << "call " << t << " id " << kv.first;
      }
    }
  }, cfg());
}

TEST(TensorIds, ACallOnABufferWhoseIdsMovedNamesTheId) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x, y;
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0], kTensors[1]}, x, nullptr), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[1], kTensors[2]}, y, nullptr), lowrankSuccess);
    // x again, not declared again: id 202 is y's now.
    std::vector<float> g(x.size(), 1.f);
    EXPECT_EQ(lowrankAllReduce(g.data(), x.data(), x.size(), lowrankFloat32, lowrankAvg, comm,
                               nullptr),
              lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("tensor id 202"), std::string::npos)
        << lowrankGetLastError(comm);
    // Declared again, it takes them back.
    std::vector<lowrankTensor_t> d = {desc(kTensors[0]), desc(kTensors[1])};
    ASSERT_EQ(lowrankBufferSetTensors(comm, x.data(), 2, d.data()), lowrankSuccess);
    EXPECT_EQ(lowrankAllReduce(g.data(), x.data(), x.size(), lowrankFloat32, lowrankAvg, comm,
                               nullptr),
              lowrankSuccess)
        << lowrankGetLastError(comm);
  }, cfg());
}

// A call of another dtype or count on a buffer whose ids nobody took is no moved id: another dtype
// is planned again with the state kept; a count other than the declared total names the count.
TEST(TensorIds, AnotherDtypeOrCountIsNotAMovedId) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x;
    ASSERT_EQ(callGroup(comm, r, 0, kTensors, x, nullptr), lowrankSuccess);
    std::vector<uint16_t> g16(x.size(), 0x3f80), out16(x.size());  // bfloat16 ones, in x's place
    EXPECT_EQ(lowrankAllReduce(g16.data(), x.data(), x.size() / 2, lowrankBfloat16, lowrankAvg,
                               comm, nullptr),
              lowrankInvalidUsage);  // half the count: the layout does not hold it
    const std::string why = lowrankGetLastError(comm);
    EXPECT_EQ(why.find("taken by another buffer"), std::string::npos) << why;
    EXPECT_NE(why.find("count"), std::string::npos) << why;
    std::vector<float> g(x.size(), 1.f);
    EXPECT_EQ(lowrankAllReduce(g.data(), x.data(), x.size(), lowrankFloat32, lowrankAvg, comm, nullptr),
              lowrankSuccess) << lowrankGetLastError(comm);
    lowrankStats_t st;
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.buffers, 1u);
  }, cfg());
}

// From the new-user trial: an id declared again with another shape is refused naming it (the
// residual of the old shape was once copied past the new one's end), growing or shrinking.
TEST(TensorIds, AnIdDeclaredWithAnotherShapeIsRefused) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x, y;
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0]}, x, nullptr), lowrankSuccess);
    T other{kTensors[0].id, {8, 8}};
    EXPECT_EQ(callGroup(comm, r, 1, {other}, y, nullptr), lowrankInvalidUsage);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("tensor id 101 holds state of shape (24,40)"),
              std::string::npos) << lowrankGetLastError(comm);
    // Reset of the buffer holding it starts the id afresh: then any shape.
    ASSERT_EQ(lowrankBufferReset(comm, x.data()), lowrankSuccess);
    EXPECT_EQ(callGroup(comm, r, 1, {other}, y, nullptr), lowrankSuccess) << lowrankGetLastError(comm);
  }, cfg());
}

// A restore by position staged before the buffer is declared with ids is split into them, not lost;
// a buffer with a layout and calls hands its state to its new ids likewise.
TEST(TensorIds, AnAnonymousBuffersStateGoesToItsNewIds) {
  const int calls = 5, first = 2;
  auto straight = straightRun(1, calls);
  withComms(1, [&](int r, lowrankComm_t comm) {
    // Anonymous for `first` calls (the ids' first Q would differ: so from a start by position, which
    // carries its Q), then declared with ids: the outputs equal the anonymous buffer's own.
    std::vector<float> g, buf, anon;
    const size_t count = countOf(kTensors);
    std::vector<std::vector<float>> want;
    {  // the anonymous run throughout, on a second buffer
      std::vector<float> a(count);
      ASSERT_EQ(setLayoutOf(comm, a.data(), kTensors), lowrankSuccess);
      for (int t = 0; t < calls; ++t) {
        std::vector<float> in;
        for (const T& x : kTensors) { auto v = grad(x, r, t); in.insert(in.end(), v.begin(), v.end()); }
        ASSERT_EQ(lowrankAllReduce(in.data(), a.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr), lowrankSuccess);
        want.push_back(a);
      }
      lowrankBufferRelease(comm, a.data());
    }
    buf.resize(count);
    ASSERT_EQ(setLayoutOf(comm, buf.data(), kTensors), lowrankSuccess);
    for (int t = 0; t < calls; ++t) {
      if (t == first) {  // the switch, mid-run
        std::vector<lowrankTensor_t> d;
        for (const T& x : kTensors) d.push_back(desc(x));
        ASSERT_EQ(lowrankBufferSetTensors(comm, buf.data(), int(d.size()), d.data()), lowrankSuccess)
            << lowrankGetLastError(comm);
      }
      std::vector<float> in;
      for (const T& x : kTensors) { auto v = grad(x, r, t); in.insert(in.end(), v.begin(), v.end()); }
      ASSERT_EQ(lowrankAllReduce(in.data(), buf.data(), count, lowrankFloat32, lowrankAvg, comm, nullptr),
                lowrankSuccess) << lowrankGetLastError(comm);
      EXPECT_EQ(0, std::memcmp(buf.data(), want[t].data(), count * 4)) << "call " << t;
    }
  }, cfg());
  (void)straight;
}

// Release frees what the buffer gave up and no buffer took; reset starts its declared ids afresh
// wherever they are held.
TEST(TensorIds, ReleaseFreesWhatTheBufferGaveUpAndResetWhatItDeclares) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> a, b;
    lowrankStats_t st;
    for (int i = 0; i < 5; ++i) {  // five records, four of them parked on a's account
      T t{uint64_t(1000 + i), {24, 40}};
      ASSERT_EQ(callGroup(comm, r, 0, {t}, a, nullptr), lowrankSuccess);
    }
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.buffers, 5u);
    ASSERT_EQ(lowrankBufferRelease(comm, a.data()), lowrankSuccess);
    ASSERT_EQ(lowrankGetStats(comm, &st), lowrankSuccess);
    EXPECT_EQ(st.buffers, 0u);
    EXPECT_EQ(st.stateBytes, 0u);
    // b takes a's tensors; a reset of a (declaring them) starts them afresh, also in b.
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0]}, a, nullptr), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 1, {kTensors[0]}, b, nullptr), lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, b.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.calls, 2u);
    ASSERT_EQ(lowrankBufferReset(comm, a.data()), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 2, {kTensors[0]}, b, nullptr, /*declare=*/false), lowrankSuccess)
        << lowrankGetLastError(comm);
    ASSERT_EQ(lowrankBufferGetView(comm, b.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.calls, 1u);  // afresh
    // A reset through another buffer's declaration of one of b's ids: b goes on, that id afresh.
    std::vector<float> c(kTensors[0].numel());
    lowrankTensor_t d = desc(kTensors[0]);
    ASSERT_EQ(lowrankBufferSetTensors(comm, c.data(), 1, &d), lowrankSuccess);
    ASSERT_EQ(lowrankBufferReset(comm, c.data()), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 3, {kTensors[0]}, b, nullptr, /*declare=*/false), lowrankSuccess)
        << lowrankGetLastError(comm);
    ASSERT_EQ(lowrankBufferGetView(comm, b.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.calls, 1u);
  }, cfg());
}

// A tensor joining a buffer whose other tensors have a warm start draws its first Q as a fresh
// buffer would: its outputs equal those of a buffer of its own, bit for bit (host).
TEST(TensorIds, ATensorJoiningWarmTensorsDrawsAsAFreshBufferWould) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x, alone, mixed;
    Outs o1, o2;
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0]}, alone, &o1), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 1, {kTensors[0]}, alone, &o1), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[1]}, x, nullptr), lowrankSuccess);  // 202 warm
    std::vector<float> solo;
    Outs os;
    ASSERT_EQ(lowrankBufferRelease(comm, alone.data()), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0]}, solo, &os), lowrankSuccess);  // 101 fresh, alone
    ASSERT_EQ(lowrankBufferRelease(comm, solo.data()), lowrankSuccess);
    ASSERT_EQ(callGroup(comm, r, 1, {kTensors[1], kTensors[0]}, mixed, &o2), lowrankSuccess);
    // 101's first call: joined to a warm 202 in `mixed`, alone in `solo`: the same bits.
    (void)o1;
    Outs fresh101;
    withComms(1, [&](int r2, lowrankComm_t c2) {
      std::vector<float> z;
      ASSERT_EQ(callGroup(c2, r2, 1, {kTensors[0]}, z, &fresh101), lowrankSuccess);
    }, cfg());
    EXPECT_EQ(0, std::memcmp(o2.at(101).data(), fresh101.at(101).data(), o2.at(101).size() * 4));
  }, cfg());
}

// The first Q is drawn from (seed, id): a tensor's output does not depend on its position.
TEST(TensorIds, FirstQFollowsTheIdNotThePosition) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x, y;
    Outs ox, oy;
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[0], kTensors[1]}, x, &ox), lowrankSuccess);
    lowrankBufferRelease(comm, x.data());
    ASSERT_EQ(callGroup(comm, r, 0, {kTensors[1], kTensors[0]}, y, &oy), lowrankSuccess);
    expectSame(ox, oy, "swapped positions");
    EXPECT_NE(ox.at(101), grad(kTensors[0], r, 0));  // compressed, not passed through
  }, cfg());
}

// Warm-up per id: a tensor joins after the others' warm-up and is exact for its own.
TEST(TensorIds, WarmUpIsCountedPerId) {
  const int start = 2;
  withComms(1, [&](int r, lowrankComm_t comm) {
    std::vector<float> x;
    lowrankBufferView_t v;
    for (int t = 0; t < start; ++t) {
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[0]}, x, nullptr), lowrankSuccess);
      ASSERT_EQ(lowrankBufferGetView(comm, x.data(), &v), lowrankSuccess);
      EXPECT_EQ(v.ncompressed, 0) << "call " << t;
    }
    for (int t = start; t < 2 * start + 1; ++t) {
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[0], kTensors[1]}, x, nullptr), lowrankSuccess);
      ASSERT_EQ(lowrankBufferGetView(comm, x.data(), &v), lowrankSuccess);
      // 101 has made its warm-up; 202 joined at call `start` and makes its own.
      EXPECT_EQ(v.ncompressed, t < 2 * start ? 1 : 2) << "call " << t;
    }
  }, cfg(start));
}

// A tensor's own rank, or exact.
TEST(TensorIds, EachTensorsTreatmentIsItsOwn) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    (void)r;
    std::vector<lowrankTensor_t> d = {desc(kTensors[0], 1), desc(kTensors[1], LOWRANK_RANK_EXACT)};
    const size_t count = kTensors[0].numel() + kTensors[1].numel();
    std::vector<float> g = gaussian(count, 3), buf(count);
    ASSERT_EQ(lowrankBufferSetTensors(comm, buf.data(), 2, d.data()), lowrankSuccess);
    ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), count, lowrankFloat32, lowrankSum, comm, nullptr),
              lowrankSuccess);
    lowrankBufferView_t v;
    ASSERT_EQ(lowrankBufferGetView(comm, buf.data(), &v), lowrankSuccess);
    EXPECT_EQ(v.ncompressed, 1);
    EXPECT_EQ(v.pElements, kTensors[0].shape[0] * 1);
    EXPECT_EQ(v.exactElements, kTensors[1].numel());
  }, cfg());
}

TEST(TensorIds, BadDeclarationsAreRefused) {
  withComms(1, [&](int r, lowrankComm_t comm) {
    (void)r;
    std::vector<float> buf(2000);
    std::vector<lowrankTensor_t> twice = {desc(kTensors[0]), desc(kTensors[0])};
    EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), 2, twice.data()), lowrankInvalidArgument);
    EXPECT_NE(std::string(lowrankGetLastError(comm)).find("id 101 is given twice"), std::string::npos);
    lowrankTensor_t bad = desc(kTensors[0], -2);
    EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), 1, &bad), lowrankInvalidArgument);
    bad = desc(kTensors[0]);
    bad.ndims = 9;
    EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), 1, &bad), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferSetTensors(comm, buf.data(), 0, &bad), lowrankInvalidArgument);
    EXPECT_EQ(lowrankBufferSetTensors(comm, nullptr, 1, &bad), lowrankInvalidArgument);
  }, cfg());
}

std::map<uint64_t, lowrank::SavedTensor> byId(const Bytes& b) {
  lowrank::SavedTensors s;
  EXPECT_TRUE(lowrank::decode(b.data(), b.size(), &s).ok());
  std::map<uint64_t, lowrank::SavedTensor> m;
  for (auto& t : s.tensors) m[t.id] = t;
  return m;
}

// Saved in one bucketing, restored into another on a new communicator: each id's residual and Q
// equal the uninterrupted run's, and so do the outputs.
TEST(TensorIds, ACheckpointRestoresIntoAnotherBucketing) {
  const int N = 2, first = 3, calls = 6;
  auto straight = straightRun(N, calls);
  std::vector<Bytes> saved(N);
  std::vector<std::map<uint64_t, lowrank::SavedTensor>> restartedState(N);
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < first; ++t) ASSERT_EQ(callGroup(comm, r, t, kTensors, buf, nullptr), lowrankSuccess);
    saved[r] = save(comm, buf.data());
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> a, b, any(1);
    ASSERT_EQ(lowrankBufferRestoreState(comm, any.data(), saved[r].data(), saved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    for (int t = first; t < calls; ++t) {
      Outs o;
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[1], kTensors[2]}, a, &o), lowrankSuccess)
          << lowrankGetLastError(comm);
      ASSERT_EQ(callGroup(comm, r, t, {kTensors[0]}, b, &o), lowrankSuccess);
      expectSame(o, straight[r][t], "call " + std::to_string(t));
    }
    // Per id, the state equals the uninterrupted run's (saved from its one buffer).
    auto mine = byId(save(comm, a.data()));
    for (auto& kv : byId(save(comm, b.data()))) mine[kv.first] = kv.second;
    restartedState[r] = mine;
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t) ASSERT_EQ(callGroup(comm, r, t, kTensors, buf, nullptr), lowrankSuccess);
    auto theirs = byId(save(comm, buf.data()));
    ASSERT_EQ(theirs.size(), kTensors.size());
    for (auto& kv : theirs) {
      const lowrank::SavedTensor& m = restartedState[r][kv.first];
      EXPECT_EQ(m.calls, kv.second.calls);
      EXPECT_EQ(m.haveQ, kv.second.haveQ);
      EXPECT_EQ(m.residual, kv.second.residual) << "id " << kv.first;
      EXPECT_EQ(m.qt, kv.second.qt) << "id " << kv.first;
    }
    EXPECT_TRUE(theirs.at(101).haveQ);
  }, cfg());
}

// Bytes saved by a buffer without ids (format 2 by position) restore into a buffer declaring those
// tensors: the
// calls after it equal the anonymous buffer's own (the warm start comes from the bytes).
TEST(TensorIds, BytesByPositionRestoreIntoABufferWithIds) {
  const int N = 2, first = 3, calls = 6;
  std::vector<std::vector<std::vector<float>>> anon(N);
  std::vector<Bytes> saved(N);
  auto layout = [](lowrankComm_t comm, void* buf) {
    ASSERT_EQ(setLayoutOf(comm, buf, kTensors), lowrankSuccess);
  };
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    for (int t = 0; t < calls; ++t) {
      std::vector<float> g;
      for (const T& x : kTensors) {
        auto v = grad(x, r, t);
        g.insert(g.end(), v.begin(), v.end());
      }
      buf.resize(g.size());
      if (t == 0) layout(comm, buf.data());
      ASSERT_EQ(lowrankAllReduce(g.data(), buf.data(), g.size(), lowrankFloat32, lowrankAvg, comm,
                                 nullptr), lowrankSuccess);
      anon[r].push_back(buf);
      if (t == first - 1) saved[r] = save(comm, buf.data());
    }
  }, cfg());
  withComms(N, [&](int r, lowrankComm_t comm) {
    std::vector<float> buf;
    std::vector<lowrankTensor_t> d;
    size_t count = 0;
    for (const T& t : kTensors) {
      d.push_back(desc(t));
      count += t.numel();
    }
    buf.resize(count);
    ASSERT_EQ(lowrankBufferSetTensors(comm, buf.data(), int(d.size()), d.data()), lowrankSuccess);
    ASSERT_EQ(lowrankBufferRestoreState(comm, buf.data(), saved[r].data(), saved[r].size()),
              lowrankSuccess) << lowrankGetLastError(comm);
    for (int t = first; t < calls; ++t) {
      ASSERT_EQ(callGroup(comm, r, t, kTensors, buf, nullptr, /*declare=*/false), lowrankSuccess)
          << lowrankGetLastError(comm);
      EXPECT_EQ(0, std::memcmp(buf.data(), anon[r][t].data(), count * 4)) << "call " << t;
    }
  }, cfg());
}

}  // namespace
