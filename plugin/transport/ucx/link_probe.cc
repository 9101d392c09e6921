#include "transport/ucx/link_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "transport/ucx/algorithms.h"
#include "transport/ucx/tuner.h"

namespace lowrank::ucx {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One timed exchange of a pair: the initiator sends `count` messages of `bytes` and waits for the
// partner's one small answer; the partner answers once all have come. Seconds at the initiator,
// 0 at the partner. A rank without a partner only takes the sequence number.
Status once(UcxComm& comm, uint32_t seq, int partner, size_t bytes, int count, size_t answerBytes,
            std::vector<std::byte>* buf, double* sec) {
  *sec = 0;
  if (partner < 0) return Status::Ok();
  Exchange ex(comm, seq, nullptr);  // not counted: the probe's bytes are no allreduce's
  Exchange::Handle h;
  std::byte* b = buf->data();
  if (comm.rank() < partner) {
    const double t0 = now();
    for (int i = 0; i < count; ++i) LR_RETURN_IF_ERROR(ex.send(partner, uint32_t(i), b, bytes, 0, &h));
    LR_RETURN_IF_ERROR(ex.recv(partner, uint32_t(count), b + bytes, answerBytes, &h));
    LR_RETURN_IF_ERROR(ex.waitAll());
    *sec = now() - t0;
    return Status::Ok();
  }
  for (int i = 0; i < count; ++i)
    LR_RETURN_IF_ERROR(ex.recv(partner, uint32_t(i), b + size_t(i) * bytes, bytes, &h));
  LR_RETURN_IF_ERROR(ex.waitAll());
  LR_RETURN_IF_ERROR(ex.send(partner, uint32_t(count), b, answerBytes, 0, &h));
  return ex.waitAll();
}

}  // namespace

CostParams fitLink(const ProbeTimings& t, const ProbeOptions& o) {
  CostParams c{0, 0, 0};
  if (t.smallRtt <= 0) return c;
  c.alphaSec = (t.smallRttAlone > 0 ? t.smallRttAlone : t.smallRtt) / 2;
  c.overheadSec = std::max(0.0, (t.burst - t.smallRtt) / (o.burst - 1));
  c.betaSecPerByte = std::max(0.0, (t.large2 - t.large1) / double(o.large2Bytes - o.large1Bytes));
  return c;
}

Status probeLinks(UcxComm& comm, uint32_t* seq, const ProbeOptions& opt,
                  const std::function<void(ProbeTimings*)>& adjust, ProbeResult* out) {
  const double t0 = now();
  *out = ProbeResult{};
  const int n = comm.size(), r = comm.rank();
  out->partner = (r ^ 1) < n ? (r ^ 1) : -1;
  const size_t small = opt.smallBytes;
  std::vector<std::byte> buf(std::max(opt.large2Bytes, small * size_t(opt.burst)) + small);
  ProbeTimings best{1e30, 1e30, 1e30, 1e30, 1e30};
  double s;
  // Every pair at once, as a collective loads the machine and the links together: the large
  // messages (beta) and the small round trip and burst whose difference is the CPU per message
  // (o: what a rank gets of the cores while every rank is sending).
  for (int rep = 0; rep < opt.repeats; ++rep) {
    LR_RETURN_IF_ERROR(once(comm, ++*seq, out->partner, small, 1, small, &buf, &s));
    best.smallRtt = std::min(best.smallRtt, s);
    LR_RETURN_IF_ERROR(once(comm, ++*seq, out->partner, small, opt.burst, small, &buf, &s));
    best.burst = std::min(best.burst, s);
    LR_RETURN_IF_ERROR(once(comm, ++*seq, out->partner, opt.large1Bytes, 1, small, &buf, &s));
    best.large1 = std::min(best.large1, s);
    LR_RETURN_IF_ERROR(once(comm, ++*seq, out->partner, opt.large2Bytes, 1, small, &buf, &s));
    best.large2 = std::min(best.large2, s);
  }
  // The small round trip again, one pair at a time, the others asleep on their event fds
  // (ucx_comm.h): alpha is the link's latency, not the scheduler's share of the cores where the
  // processes outnumber them (16 hosts on 2 cores measured alpha 2-3x the link's with the pairs
  // at once). A barrier first (no pair's messages still moving), then a token from initiator to
  // initiator.
  uint8_t flag = 0;
  std::vector<std::byte> scratch;
  {
    Exchange ex(comm, ++*seq, nullptr);
    LR_RETURN_IF_ERROR(recursiveDoublingAllreduce(
        ex, AllreduceArgs{&flag, 1, lowrankUint8, lowrankMax, 1}, &scratch));
  }
  const uint32_t tokenSeq = ++*seq, aloneSeq = *seq + 1;
  *seq += uint32_t(opt.repeats);  // the same on every rank: each pair's exchanges reuse them
  const bool initiator = out->partner > r;
  Exchange token(comm, tokenSeq, nullptr);
  Exchange::Handle h;
  if (initiator && r >= 2) {
    LR_RETURN_IF_ERROR(token.recv(r - 2, 0, &flag, 1, &h));
    LR_RETURN_IF_ERROR(token.waitAll());
  }
  out->smallBegin = now();
  for (int rep = 0; rep < opt.repeats; ++rep) {
    LR_RETURN_IF_ERROR(once(comm, aloneSeq + uint32_t(rep), out->partner, small, 1, small, &buf, &s));
    best.smallRttAlone = std::min(best.smallRttAlone, s);
  }
  out->smallEnd = now();
  if (initiator && r + 3 < n) {  // the next pair has a partner too
    LR_RETURN_IF_ERROR(token.send(r + 2, 0, &flag, 1, 0, &h));
    LR_RETURN_IF_ERROR(token.waitAll());
  }
  // the partner's side timed nothing: it contributes no link of its own (its initiator does)
  out->timings = r < out->partner ? best : ProbeTimings{};
  if (adjust) adjust(&out->timings);
  out->local = fitLink(out->timings, opt);
  double v[3] = {out->local.alphaSec, out->local.overheadSec, out->local.betaSecPerByte};
  Exchange ex(comm, ++*seq, nullptr);
  LR_RETURN_IF_ERROR(recursiveDoublingAllreduce(
      ex, AllreduceArgs{v, 3, lowrankFloat64, lowrankMax, sizeof(double)}, &scratch));
  out->agreed = CostParams{v[0], v[2], v[1]};
  out->seconds = now() - t0;
  return Status::Ok();
}

}  // namespace lowrank::ucx
