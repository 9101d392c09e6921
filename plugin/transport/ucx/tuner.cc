#include "transport/ucx/tuner.h"

#include <algorithm>
#include <cmath>

namespace lowrank::ucx {

Tuner::Tuner(int n, int directMaxRanks, int repeats) : repeats_(std::max(1, repeats)) {
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const auto a = Algorithm(i);
    if (a == Algorithm::Direct && n > directMaxRanks) continue;
    candidates_.push_back(a);
  }
}

int Tuner::sizeClass(double bytes) {
  return std::clamp(int(std::floor(std::log2(std::max(bytes, 1.0)))), 0, kClasses - 1);
}

Tuner::Plan Tuner::plan(double bytes) const {
  const Class& c = classes_[size_t(sizeClass(bytes))];
  if (c.frozen) return {c.result.choice, false};
  return {candidates_[size_t(c.trials) % candidates_.size()], true};
}

bool Tuner::record(double bytes, double seconds) {
  Class& c = classes_[size_t(sizeClass(bytes))];
  if (c.frozen || c.trials >= trialsPerClass()) return false;
  c.seconds.push_back(seconds);
  return ++c.trials == trialsPerClass();
}

std::vector<double> Tuner::localTimings(double bytes) const {
  const Class& c = classes_[size_t(sizeClass(bytes))];
  const size_t k = candidates_.size();
  std::vector<double> med(k, 0);
  for (size_t j = 0; j < k; ++j) {
    std::vector<double> v;
    for (size_t i = j; i < c.seconds.size(); i += k) v.push_back(c.seconds[i]);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    med[j] = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  return med;
}

const TuneResult& Tuner::freeze(double bytes, const std::vector<double>& agreedSec) {
  Class& c = classes_[size_t(sizeClass(bytes))];
  TuneResult& r = c.result;
  r.sizeClass = sizeClass(bytes);
  r.candidates = candidates_;
  r.localSec = localTimings(bytes);
  r.agreedSec = agreedSec;
  size_t best = 0;
  for (size_t j = 1; j < agreedSec.size() && j < candidates_.size(); ++j)
    if (agreedSec[j] < agreedSec[best]) best = j;
  r.choice = candidates_[best];
  c.frozen = true;
  return r;
}

}  // namespace lowrank::ucx
