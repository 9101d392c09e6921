// The link probe (link_probe.h): the fit of known timings, then over UCX with comm ranks as threads:
// every rank ends with the same constants, the max over ranks of each rank's fit, even when each
// is fed its own timings (a rank that chose from its own would run another algorithm than its
// peers); pinned constants are kept; the transport reports what it measured; calls stay correct.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "tests/transport/support.h"
#include "transport/ucx/link_probe.h"

namespace lowrank::test {
namespace {

using ucx::CostParams;
using ucx::ProbeOptions;
using ucx::ProbeResult;
using ucx::ProbeTimings;

TEST(LinkProbe, FitOfKnownTimings) {
  ProbeOptions o;  // 8 B, burst 8, 64 KiB and 256 KiB
  // A link of 100 us one way with 3 us per extra message and 80 ns per byte, and a fixed 500 us
  // per large message (a rendezvous) that the two sizes cancel.
  const double alpha = 100e-6, ovh = 3e-6, beta = 80e-9, rndv = 500e-6;
  ProbeTimings t;
  t.smallRtt = 2 * alpha;
  t.burst = 2 * alpha + 7 * ovh;
  t.large1 = 2 * alpha + rndv + beta * double(o.large1Bytes);
  t.large2 = 2 * alpha + rndv + beta * double(o.large2Bytes);
  const CostParams c = ucx::fitLink(t, o);
  EXPECT_NEAR(c.alphaSec, alpha, 1e-12);
  EXPECT_NEAR(c.overheadSec, ovh, 1e-12);
  EXPECT_NEAR(c.betaSecPerByte, beta, 1e-15);
  // The round trip of a pair alone, where measured, gives alpha; o stays the difference of the
  // burst and the round trip with every pair at once.
  ProbeTimings alone = t;
  alone.smallRttAlone = 2 * alpha / 3;
  EXPECT_NEAR(ucx::fitLink(alone, o).alphaSec, alpha / 3, 1e-12);
  EXPECT_NEAR(ucx::fitLink(alone, o).overheadSec, ovh, 1e-12);
  // A burst faster than one round trip (noise) gives no negative overhead; no partner gives zeros.
  t.burst = t.smallRtt * 0.9;
  EXPECT_EQ(ucx::fitLink(t, o).overheadSec, 0);
  const CostParams none = ucx::fitLink(ProbeTimings{}, o);
  EXPECT_EQ(none.alphaSec, 0);
  EXPECT_EQ(none.betaSecPerByte, 0);
}

// Collects each rank's ProbeResult (onProbed runs on the rank's thread).
struct Probed {
  std::mutex m;
  std::vector<ProbeResult> byRank;
  explicit Probed(int n) : byRank(size_t(n)) {}
  std::function<void(const ProbeResult&)> sink(int r) {
    return [this, r](const ProbeResult& x) {
      std::lock_guard<std::mutex> lk(m);
      byRank[size_t(r)] = x;
    };
  }
};

// Small probe messages: the test is about agreement, not about this machine's links.
ProbeOptions quick() {
  ProbeOptions o;
  o.large1Bytes = 4096;
  o.large2Bytes = 16384;
  o.repeats = 2;
  return o;
}

TEST(ProbedTransport, RanksFedDifferentTimingsAgreeOnTheMax) {
  for (int n = 2; n <= 5; ++n) {  // 3 and 5: the last rank has no partner
    SCOPED_TRACE("world " + std::to_string(n));
    // Rank r's timings: every constant differs per rank, and no rank has every maximum.
    auto fed = [](int r) {
      ProbeTimings t;
      t.smallRtt = 1e-3 * (1 + (r * 5) % 3);
      t.burst = t.smallRtt + 1e-5 * (1 + (r * 7) % 4);
      t.large1 = t.smallRtt + 1e-3;
      t.large2 = t.large1 + 1e-4 * (1 + (r * 3) % 5);
      return t;
    };
    const ProbeOptions po = quick();
    CostParams want{0, 0, 0};
    for (int r = 0; r < n; r += 2) {  // the initiators of the pairs (r, r + 1) time the links
      if (r + 1 >= n) continue;
      const CostParams c = ucx::fitLink(fed(r), po);
      want.alphaSec = std::max(want.alphaSec, c.alphaSec);
      want.overheadSec = std::max(want.overheadSec, c.overheadSec);
      want.betaSecPerByte = std::max(want.betaSecPerByte, c.betaSecPerByte);
    }
    Probed res(n);
    auto g = makeGroup(n, 10, [&](int r) {
      UcxTransportOptions o;
      o.probe = true;
      o.probeOptions = po;
      o.probeAdjust = [r, &fed](ProbeTimings* t) {
        if (t->smallRtt > 0) *t = fed(r);  // the ranks that timed something
      };
      o.onProbed = res.sink(r);
      return o;
    });
    ASSERT_EQ(g.size(), size_t(n));
    for (int r = 0; r < n; ++r) {
      const ProbeResult& x = res.byRank[size_t(r)];
      EXPECT_EQ(x.partner, (r ^ 1) < n ? (r ^ 1) : -1) << "comm rank " << r;
      EXPECT_EQ(x.agreed.alphaSec, want.alphaSec) << "comm rank " << r;
      EXPECT_EQ(x.agreed.overheadSec, want.overheadSec) << "comm rank " << r;
      EXPECT_EQ(x.agreed.betaSecPerByte, want.betaSecPerByte) << "comm rank " << r;
      const std::string info = g[size_t(r)]->info();
      EXPECT_NE(info.find("\"choice\": \"measured\""), std::string::npos) << info;
      char alpha[64];
      snprintf(alpha, sizeof alpha, "\"alpha_us\": %.6g", 1e6 * want.alphaSec);
      EXPECT_NE(info.find(alpha), std::string::npos) << info;
    }
    for (int call = 0; call < 3; ++call) {
      checkExactFloatSum(g, size_t(1) << (4 * call + 2), uint32_t(call));
      if (HasFatalFailure()) return;
    }
    EXPECT_NE(g[0]->info().find("\"algorithms\": {\""), std::string::npos) << g[0]->info();
  }
}

TEST(ProbedTransport, MeasuresRealLinksAndKeepsPinnedConstants) {
  const int n = 4;
  Probed res(n);
  auto g = makeGroup(n, 10, [&](int r) {
    UcxTransportOptions o;
    o.probe = true;
    o.probeOptions = quick();
    o.cost.betaSecPerByte = 0.5e-9;
    o.betaPinned = true;
    o.onProbed = res.sink(r);
    return o;
  });
  ASSERT_EQ(g.size(), size_t(n));
  for (int r = 0; r < n; ++r) {
    const ProbeResult& x = res.byRank[size_t(r)];
    if (r % 2 == 0) {  // initiators timed real exchanges (their order by size is the machine's)
      EXPECT_GT(x.timings.smallRtt, 0);
      EXPECT_GT(x.timings.burst, 0);
      EXPECT_GT(x.timings.large1, 0);
      EXPECT_GT(x.timings.large2, 0);
    } else {
      EXPECT_EQ(x.timings.smallRtt, 0);
    }
    EXPECT_GT(x.agreed.alphaSec, 0);
    const std::string info = g[size_t(r)]->info();
    EXPECT_NE(info.find("\"beta_ns_per_byte\": 0.5,"), std::string::npos) << info;  // pinned
    EXPECT_NE(info.find("\"probe\": {"), std::string::npos) << info;
  }
  checkExactFloatSum(g, 1000, 7);
}

// The round trips that give alpha run one pair at a time, in the order of the pairs (where the
// processes outnumber the cores, pairs timed together measure the scheduler), after those of
// every pair at once. 7 ranks: three pairs and one rank without.
TEST(ProbedTransport, SmallExchangesOnePairAtATime) {
  const int n = 7;
  Probed res(n);
  auto g = makeGroup(n, 10, [&](int r) {
    UcxTransportOptions o;
    o.probe = true;
    o.probeOptions = quick();
    o.onProbed = res.sink(r);
    return o;
  });
  ASSERT_EQ(g.size(), size_t(n));
  for (int r = 0; r + 1 < n; r += 2) {
    const ProbeResult& a = res.byRank[size_t(r)];
    EXPECT_GT(a.timings.smallRttAlone, 0) << "comm rank " << r;
    EXPECT_LT(a.smallBegin, a.smallEnd) << "comm rank " << r;
    if (r + 3 < n) {
      const ProbeResult& next = res.byRank[size_t(r + 2)];
      EXPECT_LE(a.smallEnd, next.smallBegin) << "pairs " << r / 2 << " and " << r / 2 + 1 << " overlap";
    }
  }
  checkExactFloatSum(g, 1000, 3);  // the sequence numbers stayed in step
}

TEST(ProbedTransport, NoProbeWhereTheModelDoesNotChoose) {
  auto g = makeGroup(2, 10, [&](int) {
    UcxTransportOptions o;
    o.probe = true;
    o.algorithm = ucx::Algorithm::Ring;  // forced: nothing to measure for
    o.onProbed = [](const ProbeResult&) { ADD_FAILURE() << "probed with a forced algorithm"; };
    return o;
  });
  ASSERT_EQ(g.size(), 2u);
  EXPECT_NE(g[0]->info().find("\"choice\": \"forced\""), std::string::npos) << g[0]->info();
}

}  // namespace
}  // namespace lowrank::test
