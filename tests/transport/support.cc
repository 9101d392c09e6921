#include "tests/transport/support.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <type_traits>

#include "util/convert.h"
#include "transport/bootstrap/bootstrap.h"
#include "util/dtype.h"

namespace lowrank::test {

using host::bf16_t;
using host::half_t;

void runRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<std::unique_ptr<Transport>> makeGroup(int n, double timeoutSec,
                                                  const UcxTransportOptions& opt) {
  return makeGroup(n, timeoutSec, [&](int) { return opt; });
}

std::vector<std::unique_ptr<Transport>> makeGroup(
    int n, double timeoutSec, const std::function<UcxTransportOptions(int rank)>& optionsOf) {
  lowrankUniqueId id;
  Status st = bootstrap::makeUniqueId(&id, timeoutSec);
  EXPECT_TRUE(st.ok()) << st.msg;
  if (!st.ok()) return {};
  std::vector<std::unique_ptr<Transport>> group(static_cast<size_t>(n));
  std::vector<Status> sts(static_cast<size_t>(n));
  runRanks(n, [&](int r) { sts[size_t(r)] = createUcxTransport(id, r, n, timeoutSec, optionsOf(r), &group[size_t(r)]);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(sts[size_t(r)].ok()) << "comm rank " << r << ": " << sts[size_t(r)].msg;
    if (!sts[size_t(r)].ok()) return {};
    EXPECT_EQ(group[size_t(r)]->rank(), r);
    EXPECT_EQ(group[size_t(r)]->size(), n);
  }
  return group;
}

std::vector<Status> allreduceAll(std::vector<std::unique_ptr<Transport>>& group,
                                 std::vector<std::vector<uint8_t>>& bufs, size_t count,
                                 lowrankDataType_t dtype, lowrankRedOp_t op) {
  std::vector<Status> sts(group.size());
  runRanks(int(group.size()), [&](int r) {
    sts[size_t(r)] = group[size_t(r)]->allreduce(bufs[size_t(r)].data(), count, dtype, op);
  });
  return sts;
}

namespace {

template <typename T> T fromDouble(double v) {
  if constexpr (std::is_same_v<T, half_t>) return host::toHalf(float(v));
  else if constexpr (std::is_same_v<T, bf16_t>) return host::toBf16(float(v));
  else return T(v);
}
template <typename T> double toDouble(T x) {
  if constexpr (std::is_same_v<T, half_t> || std::is_same_v<T, bf16_t>) return host::toFloat(x);
  else return double(x);
}

template <typename T>
void fill(std::vector<uint8_t>& out, lowrankRedOp_t op, int rank, size_t count, uint32_t seed) {
  constexpr bool isFloat = !std::is_integral_v<T>;
  static const double prodF[8] = {0.5, 1, 2, -1, -0.5, 1, 1, -2};
  static const int prodS[8] = {1, -1, 2, 1, 3, 1, -1, 1};
  static const int prodU[8] = {1, 2, 3, 1, 1, 5, 1, 7};
  T* p = reinterpret_cast<T*>(out.data());
  for (size_t i = 0; i < count; ++i) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (uint32_t(rank) * 40503u + seed * 97u);
    h ^= h >> 13;
    double v;
    if (op == lowrankProd) {
      v = isFloat ? prodF[h % 8] : std::is_signed_v<T> ? prodS[h % 8] : prodU[h % 8];
    } else {
      int k = int(h % 17) - 8;
      v = isFloat ? k / 4.0 : std::is_signed_v<T> ? k : k + 8;
    }
    p[i] = fromDouble<T>(v);
  }
}

template <typename T>
void reference(const std::vector<std::vector<uint8_t>>& in, std::vector<uint8_t>& out, size_t count,
               lowrankRedOp_t op) {
  const int n = int(in.size());
  T* o = reinterpret_cast<T*>(out.data());
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      T acc = reinterpret_cast<const T*>(in[0].data())[i];
      for (int r = 1; r < n; ++r) {
        T x = reinterpret_cast<const T*>(in[size_t(r)].data())[i];
        switch (op) {
          case lowrankSum: case lowrankAvg: acc = T(uint64_t(U(acc)) + uint64_t(U(x))); break;
          case lowrankProd: acc = T(uint64_t(U(acc)) * uint64_t(U(x))); break;
          case lowrankMax: acc = x > acc ? x : acc; break;
          case lowrankMin: acc = x < acc ? x : acc; break;
          default: break;
        }
      }
      if (op == lowrankAvg) acc = T(acc / n);
      o[i] = acc;
    } else {
      // Exact in double by construction of the data.
      double acc = toDouble(reinterpret_cast<const T*>(in[0].data())[i]);
      for (int r = 1; r < n; ++r) {
        double x = toDouble(reinterpret_cast<const T*>(in[size_t(r)].data())[i]);
        switch (op) {
          case lowrankSum: case lowrankAvg: acc += x; break;
          case lowrankProd: acc *= x; break;
          case lowrankMax: acc = x > acc ? x : acc; break;
          case lowrankMin: acc = x < acc ? x : acc; break;
          default: break;
        }
      }
      if (op == lowrankAvg) {
        if constexpr (std::is_same_v<T, double>) acc = acc / n;
        else acc = double(float(acc) / float(n));  // float, half, bf16 divide in float
      }
      o[i] = fromDouble<T>(acc);
    }
  }
}

template <template <typename> class F, typename... A>
void byType(lowrankDataType_t t, A&&... a) {
  switch (t) {
    case lowrankInt8: F<int8_t>::run(a...); break;
    case lowrankUint8: F<uint8_t>::run(a...); break;
    case lowrankInt32: F<int32_t>::run(a...); break;
    case lowrankUint32: F<uint32_t>::run(a...); break;
    case lowrankInt64: F<int64_t>::run(a...); break;
    case lowrankUint64: F<uint64_t>::run(a...); break;
    case lowrankFloat16: F<half_t>::run(a...); break;
    case lowrankFloat32: F<float>::run(a...); break;
    case lowrankFloat64: F<double>::run(a...); break;
    case lowrankBfloat16: F<bf16_t>::run(a...); break;
    default: break;
  }
}
template <typename T> struct FillFn {
  static void run(std::vector<uint8_t>& o, lowrankRedOp_t op, int r, size_t c, uint32_t s) { fill<T>(o, op, r, c, s); }
};
template <typename T> struct RefFn {
  static void run(const std::vector<std::vector<uint8_t>>& in, std::vector<uint8_t>& o, size_t c,
                  lowrankRedOp_t op) { reference<T>(in, o, c, op); }
};

}  // namespace

std::vector<uint8_t> exactData(lowrankDataType_t dtype, lowrankRedOp_t op, int rank, size_t count,
                               uint32_t seed) {
  std::vector<uint8_t> out(count * dtypeSize(dtype));
  byType<FillFn>(dtype, out, op, rank, count, seed);
  return out;
}

std::vector<uint8_t> referenceReduce(const std::vector<std::vector<uint8_t>>& inputs, size_t count,
                                     lowrankDataType_t dtype, lowrankRedOp_t op) {
  std::vector<uint8_t> out(count * dtypeSize(dtype));
  byType<RefFn>(dtype, inputs, out, count, op);
  return out;
}

long firstDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t elemSize) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i += elemSize)
    if (std::memcmp(&a[i], &b[i], elemSize) != 0) return long(i / elemSize);
  return -1;
}

uint64_t elementsSent(const std::vector<std::unique_ptr<Transport>>& group) {
  uint64_t s = 0;
  for (auto& t : group) s += t->counters().elementsSent.load();
  return s;
}

void checkExactFloatSum(std::vector<std::unique_ptr<Transport>>& g, size_t count, uint32_t seed) {
  const int n = int(g.size());
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n)), bufs;
  for (int r = 0; r < n; ++r) in[size_t(r)] = exactData(lowrankFloat32, lowrankSum, r, count, seed);
  const auto ref = referenceReduce(in, count, lowrankFloat32, lowrankSum);
  bufs = in;
  const auto sts = allreduceAll(g, bufs, count, lowrankFloat32, lowrankSum);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << "comm rank " << r << ": " << sts[size_t(r)].msg;
    ASSERT_EQ(firstDiff(bufs[size_t(r)], ref, 4), -1) << "comm rank " << r << ", count " << count;
  }
}

}  // namespace lowrank::test
