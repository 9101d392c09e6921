#include "soak/rank_work.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "api/comm.h"
#include "soak/values.h"

namespace lowrank::soak {
namespace {

template <typename T>
const T* at(const void* p) {
  return static_cast<const T*>(p);
}

// m = max(m, x), where a NaN, once seen, stays: it is the worst error there is.
void keepMax(double& m, double x) {
  if (!std::isnan(m) && !(x <= m)) m = x;
}

// A gradient-like input: a rank-1 signal shared by every rank (slowly changing in amplitude from
// call to call), plus noise of this rank and call, viewed as rows of width ~sqrt(count).
template <typename T>
void fillGradient(const Step& s, int r, T* out) {
  const Slot& sl = *s.slot;
  const size_t w = std::max<size_t>(1, size_t(std::sqrt(double(s.count))));
  const uint64_t rows = stream(sl.signal, 1), cols = stream(sl.signal, 2);
  const uint64_t noise = stream(s.inputs, uint64_t(r));
  const float amp = 1.f + 0.5f * uniform(s.inputs, 0);
  std::vector<float> col(w);
  for (size_t j = 0; j < w; ++j) col[j] = amp * sl.scale * uniform(cols, j);
  for (size_t i0 = 0; i0 < s.count; i0 += w) {
    const float a = uniform(rows, i0 / w), n = 0.3f * sl.scale;
    const size_t len = std::min(w, s.count - i0);
    for (size_t j = 0; j < len; ++j)
      out[i0 + j] = fromDouble<T>(a * col[j] + n * uniform(noise, i0 + j));
  }
  if (r == s.nanRank) out[s.nanIndex] = fromDouble<T>(NAN);
}

// Elements of [lo, hi) whose bytes differ between a and b (es bytes each).
size_t differing(const void* a, const void* b, size_t es, size_t lo, size_t hi) {
  const char* x = static_cast<const char*>(a) + lo * es;
  const char* y = static_cast<const char*>(b) + lo * es;
  if (std::memcmp(x, y, (hi - lo) * es) == 0) return 0;  // the usual case, at memory speed
  size_t n = 0;
  for (size_t i = 0; i < hi - lo; ++i) n += std::memcmp(x + i * es, y + i * es, es) != 0;
  return n;
}

// The residual E of recvbuff on each rank, through the engine's state (null: none held).
std::vector<const float*> residuals(const Slot& sl, const std::vector<void*>& recv,
                                    const std::vector<lowrankComm_t>& comms, size_t* wrong) {
  std::vector<const float*> e(comms.size(), nullptr);
  for (size_t q = 0; q < comms.size(); ++q) {
    const Buffer* b = comms[q]->engine->find(recv[q]);
    const auto* st = b ? dynamic_cast<const HostState*>(b->rec ? b->rec->state.get() : nullptr) : nullptr;
    if (!st || st->error.empty()) continue;
    if (st->error.size() != sl.count)
      ++*wrong;  // a state of another count: never reset
    else
      e[q] = st->error.data();
  }
  return e;
}

}  // namespace

void fillInput(const Step& s, int r, int nranks) {
  (void)nranks;
  void* dst = s.send[size_t(r)];
  withType(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    if (s.kind == CallKind::kCompressed || s.kind == CallKind::kFallback) {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, half_t> ||
                    std::is_same_v<T, bf16_t>)
        fillGradient(s, r, out);
    } else {
      const uint64_t st = stream(s.inputs, uint64_t(r));
      for (size_t i = 0; i < s.count; ++i) out[i] = exactInput<T>(s.op, st, i);
    }
  });
}

void reference(Step& s, int nranks, size_t lo, size_t hi, Partial& p) {
  withType(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (s.kind == CallKind::kCompressed || s.kind == CallKind::kFallback) {
      double* d = s.slot->d.data();
      for (size_t i = lo; i < hi; ++i) {
        double sum = 0;
        for (int q = 0; q < nranks; ++q) {
          const double g = toDouble(at<T>(s.send[size_t(q)])[i]);
          sum += g;
          if (std::fabs(g) > p.maxG) p.maxG = std::fabs(g);
        }
        d[i] += sum / nranks;
      }
      return;
    }
    if (!s.check) return;  // an unchecked exact call needs no reference
    T* expect = reinterpret_cast<T*>(s.expected->data());
    for (size_t i = lo; i < hi; ++i) {
      double acc = toDouble(at<T>(s.send[0])[i]);
      for (int q = 1; q < nranks; ++q) {
        const double x = toDouble(at<T>(s.send[size_t(q)])[i]);
        switch (s.op) {
          case lowrankProd:
            acc *= x;
            break;
          case lowrankMax:
            acc = std::max(acc, x);
            break;
          case lowrankMin:
            acc = std::min(acc, x);
            break;
          default:
            acc += x;
            break;
        }
      }
      if (s.op == lowrankAvg) acc /= nranks;
      expect[i] = fromDouble<T>(acc);
    }
  });
}

void checkInvariant(const Slot& sl, const std::vector<void*>& recv,
                    const std::vector<lowrankComm_t>& comms, size_t lo, size_t hi, Partial& p) {
  const std::vector<const float*> e = residuals(sl, recv, comms, &p.wrong);
  const size_t nranks = comms.size();
  for (size_t i = lo; i < hi; ++i) {
    double sum = 0;
    for (size_t q = 0; q < nranks; ++q) {
      const double x = e[q] ? double(e[q][i]) : 0.0;
      sum += x;
      p.maxE = std::max(p.maxE, std::fabs(x));
    }
    keepMax(p.maxErr, std::fabs(sl.d[i] - sum / double(nranks)));
  }
}

void verify(Step& s, const std::vector<lowrankComm_t>& comms, size_t lo, size_t hi, Partial& p) {
  const size_t nranks = comms.size(), es = dtypeSize(s.dtype);
  const char* out0 = static_cast<const char*>(s.recv[0]);
  for (size_t q = 1; q < nranks; ++q) p.differ += differing(out0, s.recv[q], es, lo, hi);
  if (s.kind == CallKind::kExactSlot || s.kind == CallKind::kExactTemp) {
    if (!s.check) return;
    for (size_t q = 0; q < nranks; ++q)
      p.wrong += differing(s.expected->data(), s.recv[q], es, lo, hi);
    return;
  }
  withType(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* out = at<T>(out0);
    const double norm = s.op == lowrankSum ? double(nranks) : 1.0;
    double* d = s.slot->d.data();
    if (s.kind == CallKind::kFallback) {  // an exact allreduce: d holds the mean input
      for (size_t i = lo; i < hi; ++i) {
        const double o = toDouble(out[i]) / norm;
        if (s.nanIndex == i) {
          if (!std::isnan(o)) ++p.wrong;
          continue;
        }
        p.maxOut = std::max(p.maxOut, std::fabs(o));
        keepMax(p.maxErr, std::fabs(o - d[i]));
      }
      return;
    }
    for (size_t i = lo; i < hi; ++i) {
      const double o = toDouble(out[i]) / norm;
      d[i] -= o;
      p.maxOut = std::max(p.maxOut, std::fabs(o));
    }
    if (s.check) checkInvariant(*s.slot, s.recv, comms, lo, hi, p);
  });
}

}  // namespace lowrank::soak
