#include "nccl_shim/policy.h"

#include <cmath>
#include <cstring>

#include "util/convert.h"  // header only
#include "util/dtype.h"    // header only

namespace lowrank::shim {
namespace {

// True when s is x rounded to nearest in a format of `bits` mantissa bits.
bool isRoundingOf(double s, double x, int bits) {
  if (!(s > 0) || !std::isfinite(s)) return false;
  int e;
  std::frexp(s, &e);
  const double ulp = std::ldexp(1.0, e - 1 - bits);
  return std::fabs(s - x) <= ulp / 2;
}

}  // namespace

std::optional<double> preMulScalar(const PreMulSum& p) {
  double x;
  if (!host::scalarToDouble(p.dtype, p.value, &x)) return std::nullopt;
  return x;
}

std::optional<int> mapOp(int op, const PreMulSum* premul, int nranks) {
  if (op == kSum || op == kAvg) return op;
  if (op < kNumBuiltinOps || !premul || nranks < 1) return std::nullopt;
  const std::optional<double> s = preMulScalar(*premul);
  if (!s) return std::nullopt;
  if (*s == 1.0) return kSum;
  if (isRoundingOf(*s, 1.0 / nranks, dtypeMantissaBits(premul->dtype))) return kAvg;
  return std::nullopt;
}

bool eligible(int dtype, size_t count, uint64_t minBytes) {
  if (!dtypeCompressible(dtype)) return false;
  const size_t size = dtypeSize(dtype);
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) return true;
  return count > 0 && bytes >= minBytes;
}

size_t CallKeyHash::operator()(const CallKey& k) const {
  size_t h = std::hash<const void*>()(k.recv);
  h ^= std::hash<size_t>()(k.count) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= size_t(k.dtype) * 1315423911u + size_t(k.op) * 2654435761u + size_t(k.inPlace);
  return h;
}

SequencePolicy::SequencePolicy(size_t maxCycle) : maxCycle_(maxCycle ? maxCycle : 1) {}

void SequencePolicy::append(const CallKey& k) {
  last_[k] = histBase_ + hist_.size();
  hist_.push_back(k);
  if (hist_.size() > 2 * maxCycle_) {  // keep the last maxCycle_ calls
    hist_.erase(hist_.begin(), hist_.begin() + ptrdiff_t(hist_.size() - maxCycle_));
    histBase_ = last_[k] + 1 - hist_.size();
    last_.clear();
    for (size_t i = 0; i < hist_.size(); ++i) last_[hist_[i]] = histBase_ + i;
  }
}

bool SequencePolicy::searchCycle(const CallKey& k) {
  auto it = last_.find(k);
  if (it == last_.end()) return false;
  const uint64_t now = histBase_ + hist_.size(), j = it->second;
  if (now - j > maxCycle_) return false;
  cycle_.assign(hist_.begin() + ptrdiff_t(j - histBase_), hist_.end());
  repeats_ = 1;  // hist[j, now) has been seen once; this call starts its second repetition
  pos_ = 1 % cycle_.size();
  adopted_ = false;
  return true;
}

void SequencePolicy::adopt(Decision* d) {
  d->started = true;
  adopted_ = true;
  std::unordered_map<const void*, int> uses;
  for (const CallKey& c : cycle_) ++uses[c.recv];
  // Where each buffer sits in a cycle (buffers used once), with its neighbours.
  auto place = [](const std::vector<CallKey>& c, const void* buf,
                  const std::unordered_map<const void*, int>& u) -> std::optional<size_t> {
    auto it = u.find(buf);
    if (it == u.end() || it->second != 1) return std::nullopt;
    for (size_t t = 0; t < c.size(); ++t)
      if (c[t].recv == buf) return t;
    return std::nullopt;
  };
  auto sameNeighbourhood = [](const std::vector<CallKey>& a, size_t i, const std::vector<CallKey>& b,
                              size_t j) {
    const size_t na = a.size(), nb = b.size();
    return a[i] == b[j] && a[(i + na - 1) % na] == b[(j + nb - 1) % nb] &&
           a[(i + 1) % na] == b[(j + 1) % nb];
  };
  std::unordered_map<const void*, int> oldUses;
  for (const CallKey& c : active_) ++oldUses[c.recv];
  for (auto it = stateful_.begin(); it != stateful_.end();) {
    const std::optional<size_t> now = place(cycle_, it->first, uses);
    const std::optional<size_t> before = place(active_, it->first, oldUses);
    if (now && before && sameNeighbourhood(cycle_, *now, active_, *before)) {
      ++it;
    } else {
      d->release.push_back(it->first);
      it = stateful_.erase(it);
    }
  }
  shared_.clear();
  for (const auto& [buf, count] : uses)
    if (count > 1) shared_.insert(buf);
  active_ = cycle_;
}

SequencePolicy::Decision SequencePolicy::next(const CallKey& k) {
  Decision d;
  // An address that comes back under another key (count, dtype, op, in-place) is another tensor.
  auto st = stateful_.find(k.recv);
  if (st != stateful_.end() && st->second != k) {
    d.release.push_back(k.recv);
    stateful_.erase(st);
  }
  bool matched = false;
  if (!cycle_.empty()) {
    if (k == cycle_[pos_]) {
      matched = true;
      if (pos_ == 0) ++repeats_;
      pos_ = (pos_ + 1) % cycle_.size();
    } else {
      d.changed = true;
      cycle_.clear();
      adopted_ = false;
      repeats_ = 0;
      pos_ = 0;
    }
  }
  if (!matched) searchCycle(k);
  append(k);
  if (!cycle_.empty() && repeats_ >= kRepeats) {
    if (!adopted_) adopt(&d);
    if (!shared_.count(k.recv)) {
      d.compress = true;
      stateful_[k.recv] = k;
    }
  }
  return d;
}

}  // namespace lowrank::shim
