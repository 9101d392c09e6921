#include "transport/reduce.h"

#include <cstdint>
#include <type_traits>

#include "util/convert.h"

namespace lowrank::transport {
namespace {

using host::bf16_t;
using host::half_t;

// Loads an element into the type the arithmetic is done in, and stores it back.
template <typename T> struct Arith {
  using A = T;
  static A load(T x) { return x; }
  static T store(A x) { return x; }
};
template <> struct Arith<half_t> {
  using A = float;
  static float load(half_t x) { return host::toFloat(x); }
  static half_t store(float x) { return host::toHalf(x); }
};
template <> struct Arith<bf16_t> {
  using A = float;
  static float load(bf16_t x) { return host::toFloat(x); }
  static bf16_t store(float x) { return host::toBf16(x); }
};

template <typename A> inline A opSum(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return A(U(U(a) + U(b)));  // wraps instead of signed overflow (undefined behaviour)
  } else {
    return a + b;
  }
}
template <typename A> inline A opProd(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;  // no int promotion
    return A(U(W(U(a)) * W(U(b))));
  } else {
    return a * b;
  }
}
// Floats: NaN propagates (whichever operand is NaN wins), as a sum would.
template <typename A> inline A opMax(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
}
template <typename A> inline A opMin(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <typename T, typename F>
void apply(void* dstv, const void* srcv, size_t n, F f) {
  using R = Arith<T>;
  T* __restrict dst = static_cast<T*>(dstv);
  const T* __restrict src = static_cast<const T*>(srcv);
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dst[i] = R::store(f(R::load(dst[i]), R::load(src[i])));
}

template <typename T>
void reduceT(void* dst, const void* src, size_t n, lowrankRedOp_t op) {
  using A = typename Arith<T>::A;
  switch (op) {
    // Lambdas, not function pointers, so that the loop inlines (and vectorizes) the operation.
    case lowrankSum: case lowrankAvg: apply<T>(dst, src, n, [](A a, A b) { return opSum(a, b); }); break;
    case lowrankProd: apply<T>(dst, src, n, [](A a, A b) { return opProd(a, b); }); break;
    case lowrankMax: apply<T>(dst, src, n, [](A a, A b) { return opMax(a, b); }); break;
    case lowrankMin: apply<T>(dst, src, n, [](A a, A b) { return opMin(a, b); }); break;
    default: break;
  }
}

template <typename T>
void divideT(void* bufv, size_t n, int d) {
  T* buf = static_cast<T*>(bufv);
  if constexpr (std::is_integral_v<T>) {
    using W = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    for (size_t i = 0; i < n; ++i) buf[i] = T(W(buf[i]) / W(d));
  } else {
    using R = Arith<T>;
    using A = typename R::A;
    const A div = A(d);
    for (size_t i = 0; i < n; ++i) buf[i] = R::store(R::load(buf[i]) / div);
  }
}

template <template <typename> class Fn, typename... Args>
void dispatch(lowrankDataType_t t, Args&&... args) {
  switch (t) {
    case lowrankInt8: Fn<int8_t>::run(args...); break;
    case lowrankUint8: Fn<uint8_t>::run(args...); break;
    case lowrankInt32: Fn<int32_t>::run(args...); break;
    case lowrankUint32: Fn<uint32_t>::run(args...); break;
    case lowrankInt64: Fn<int64_t>::run(args...); break;
    case lowrankUint64: Fn<uint64_t>::run(args...); break;
    case lowrankFloat16: Fn<half_t>::run(args...); break;
    case lowrankFloat32: Fn<float>::run(args...); break;
    case lowrankFloat64: Fn<double>::run(args...); break;
    case lowrankBfloat16: Fn<bf16_t>::run(args...); break;
    default: break;
  }
}

template <typename T> struct ReduceFn {
  static void run(void* d, const void* s, size_t n, lowrankRedOp_t op) { reduceT<T>(d, s, n, op); }
};
template <typename T> struct DivideFn {
  static void run(void* b, size_t n, int d) { divideT<T>(b, n, d); }
};

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, lowrankDataType_t dtype, lowrankRedOp_t op) {
  dispatch<ReduceFn>(dtype, dst, src, count, op);
}

void divideBy(void* buf, size_t count, lowrankDataType_t dtype, int n) {
  if (n == 1) return;
  dispatch<DivideFn>(dtype, buf, count, n);
}

bool reductionValid(lowrankDataType_t dtype, lowrankRedOp_t op) {
  return int(dtype) >= 0 && dtype < lowrankNumTypes && int(op) >= 0 && op < lowrankNumOps;
}

}  // namespace lowrank::transport
