// The element-wise passes of the host kernels, compiled once per instruction set by
// powersgd_kernels.cc (no include guard: it includes this twice, in namespace LR_ISA, once as is and
// once under `#pragma GCC target("avx2")`, after every header these need, so that no inline
// function of another header is compiled for AVX2 there). Every pass here computes each output
// element by its own sequence of float operations (no sum across the columns a vector holds), so
// the vector width does not change one bit of a result; -ffp-contract=off keeps products and
// additions apart. The one reduction over a row here, the alternating P step's dot products
// (pOfRows), sums into 8 lanes in an order written out, whatever the vector width. PowerSGD's
// pass 1 is not here: its order follows the vector width (omp simd), its bits are held by the
// committed checkpoint fixtures, so it runs the baseline's code on every machine.
namespace lowrank::host::LR_ISA {
namespace {

// |x| >= the limit whose bits are limBits, or x is NaN or Inf: on the magnitude bits of an IEEE
// float, order is that of |x|, and NaN and Inf sit above every finite value.
inline bool beyond(float x, uint32_t limBits) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x7fffffffu) >= limBits;
}

inline uint32_t limitBits(float limit) {
  uint32_t u;
  std::memcpy(&u, &limit, 4);
  return u & 0x7fffffffu;
}

// Rows are processed in blocks of kBlock: each row of Qt (k x m, L2-resident) is then streamed
// once per block instead of once per row, which keeps pass 1 and 2 memory-bound up to k = 8.
constexpr int kBlock = 4;

// Calls f(std::integral_constant<int, K>{}) with K = k for k = 1..8, else K = 0 (k known only at
// run time). With K known, a kernel keeps the k factor values of a column in registers and makes
// one sweep over the columns instead of k (pass 2: one per 4); the additions stay in the same
// order, so the bits of every result are those of the k-sweep loops (j = 0, 1, .. k-1 for each
// element). That holds while products are not fused into additions (FMA): meson.build of this
// library passes -ffp-contract=off, so a build for a CPU with FMA keeps it too.
template <typename F>
inline decltype(auto) withK(int k, F&& f) {
  switch (k) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, 0>{});
  }
}

// Row i of M as float32. Pass 1 (add = true) fuses the error-feedback add (E += G, in place) and
// counts non-finite values; pass 2 (add = false) reads M = E, or G without error feedback.
// Without E, a G that is not float32 is converted into rows + slot * cols (see rowScratch).
template <typename T, bool add>
inline const float* rowOfM(const T* __restrict g, float* __restrict e, const MatrixView& v,
                           size_t i, int slot, float* rows, size_t* bad, uint32_t limBits) {
  const size_t len = v.rowLength(i), off = i * v.stride();
  const T* gr = g + off;
  if (e) {
    float* er = e + off;
    if (add) {
      size_t b = 0;
#pragma omp simd reduction(+ : b)
      for (size_t c = 0; c < len; ++c) {
        float x = toFloat(gr[c]) + er[c];
        er[c] = x;
        b += beyond(x, limBits);
      }
      *bad += b;
    }
    return er;
  }
  const float* m;
  if constexpr (std::is_same_v<T, float>) {
    m = gr;
  } else {
    float* row = rows + size_t(slot) * v.cols;
#pragma omp simd
    for (size_t c = 0; c < len; ++c) row[c] = toFloat(gr[c]);
    m = row;
  }
  if (add) {
    size_t b = 0;
#pragma omp simd reduction(+ : b)
    for (size_t c = 0; c < len; ++c) b += beyond(m[c], limBits);
    *bad += b;
  }
  return m;
}

// Elements of the row scratch rowOfM needs: kBlock rows of M when G is not float32 and there is
// no E to read M from. Per call, not per thread: a thread would otherwise keep the rows of the
// widest matrix it ever saw after every buffer is released.
template <typename T>
size_t rowScratch(const float* e, const MatrixView& v) {
  return !e && !std::is_same_v<T, float> ? size_t(kBlock) * v.cols : 0;
}

// Qt[j][c] += sum over the kBlock rows b of P[b][j] M[b][c], rows added in order b = 0..3, for
// the J columns j0 .. j0 + J - 1 of P (row stride k) in one sweep, their 4 J values in registers.
template <int J>
inline void qtAddColumns(float* __restrict qt, size_t cols, const float* const* m,
                         const float* __restrict pb, int k, int j0) {
  const float* __restrict m0 = m[0];
  const float* __restrict m1 = m[1];
  const float* __restrict m2 = m[2];
  const float* __restrict m3 = m[3];
  float p0[J], p1[J], p2[J], p3[J];
  for (int j = 0; j < J; ++j) {
    p0[j] = pb[j0 + j], p1[j] = pb[k + j0 + j], p2[j] = pb[2 * k + j0 + j];
    p3[j] = pb[3 * k + j0 + j];
  }
  float* __restrict q0 = qt + size_t(j0) * cols;
#pragma omp simd
  for (size_t c = 0; c < cols; ++c) {
    const float a = m0[c], b = m1[c], d = m2[c], e = m3[c];
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) {
      float* q = q0 + size_t(j) * cols;
      q[c] = (((q[c] + p0[j] * a) + p1[j] * b) + p2[j] * d) + p3[j] * e;
    }
  }
}

// All k columns of P: K = 0 (k at run time) one sweep per j; else sweeps of up to 4 columns (4 x 4
// values of P in registers: more spill, measured slower at k = 8).
template <int K>
inline void qtAddBlock(float* qt, size_t cols, const float* const* m, const float* pb, int k) {
  if constexpr (K == 0) {
    for (int j = 0; j < k; ++j) qtAddColumns<1>(qt, cols, m, pb, k, j);
  } else if constexpr (K <= 4) {
    qtAddColumns<K>(qt, cols, m, pb, k, 0);
  } else {
    qtAddColumns<4>(qt, cols, m, pb, k, 0);
    qtAddColumns<K - 4>(qt, cols, m, pb, k, 4);
  }
}

// The same for any k (one function, whatever pass 2's input type: compile time).
void qtAdd(float* qt, size_t cols, const float* const* m, const float* pb, int k) {
  withK(k, [&](auto K) { qtAddBlock<K>(qt, cols, m, pb, k); });
}

// add: M = G + E first (E += G in place), counting elements beyond the limit into *bad (the
// alternating Q step's pass); else M is E, or G without error feedback (PowerSGD's pass 2).
template <typename T, bool add = false>
void pass2(const T* __restrict g, const float* __restrict e, const MatrixView& v,
           const float* __restrict p, int k, float* __restrict qt, size_t* bad = nullptr,
           uint32_t lim = 0) {
  std::memset(qt, 0, sizeof(float) * size_t(k) * v.cols);
  std::vector<float> rows(rowScratch<T>(e, v));
  float* em = const_cast<float*>(e);  // rowOfM<.., false> never writes
  const size_t full = v.fullRows();
  size_t i = 0, none = 0;
  size_t* count = add ? bad : &none;
  for (; i + kBlock <= full; i += kBlock) {
    const float* m[kBlock];
    for (int b = 0; b < kBlock; ++b)
      m[b] = rowOfM<T, add>(g, em, v, i + b, b, rows.data(), count, lim);
    // Same order of additions as one row at a time: the result does not depend on blocking.
    qtAdd(qt, v.cols, m, p + i * k, k);
  }
  for (; i < v.rows; ++i) {
    const size_t len = v.rowLength(i);
    if (len == 0) break;
    const float* m = rowOfM<T, add>(g, em, v, i, 0, rows.data(), count, lim);
    for (int j = 0; j < k; ++j) {
      const float pij = p[i * k + j];
      float* __restrict q = qt + size_t(j) * v.cols;
#pragma omp simd
      for (size_t c = 0; c < len; ++c) q[c] += pij * m[c];
    }
  }
}

// One element of the low-rank product A = P Qt^T into a: row pr of P (K values) against the K
// values q of Qt's column, j = 0..K-1 in order, from 0 when `fromZero` (the residual's order: 0 +
// p0 q0 + ..), else from p0 q0 (the output's). V is a float, or 8 columns at once (Lanes8: IEEE per
// lane, so the same bits). Every block path below sums through it, so the residual taken in its own
// sweep and the one a P step takes for the last Q step (pRowsAfterQ) agree to the bit. Written
// through a reference: a function returning a 32-byte vector changes ABI without AVX (-Wpsabi).
template <int K, bool fromZero, typename V>
inline void lowRankAt(V& a, const float (&pr)[K], const V (&q)[K]) {
  a = fromZero ? V{} + pr[0] * q[0] : pr[0] * q[0];
#pragma GCC unroll 8
  for (int j = 1; j < K; ++j) a += pr[j] * q[j];
}

// R rows of the low-rank product A = P Qt^T at once (R = kBlock), K = k:
// each column's k values of Qt are read once for the R rows and summed in registers, j = 0..k-1
// in order, as the one-row loops below (K = 0) add them. Then, with E (rows er), E -= A; with
// out (rows o), out = s A cast to T. A starts at 0 when `fromZero` (the residual's order: 0 +
// p0 q0 + ..), else at p0 q0 (the output's): both kept as they were, so no result bit moves.
template <int K, int R, bool fromZero, bool withE, bool withO, typename T>
inline void lowRankBlock(float* const* e, T* const* out, size_t len, const float* pi, int k,
                         const float* __restrict qt, size_t qld, float s) {
  float pr[R][K];
  float* er[R];
  T* o[R];
  for (int b = 0; b < R; ++b) {
    for (int j = 0; j < K; ++j) pr[b][j] = pi[size_t(b) * k + j];
    er[b] = withE ? e[b] : nullptr;
    o[b] = withO ? out[b] : nullptr;
  }
#pragma omp simd
  for (size_t c = 0; c < len; ++c) {
    float q[K];
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) q[j] = qt[size_t(j) * qld + c];
#pragma GCC unroll 4
    for (int b = 0; b < R; ++b) {
      float a;
      lowRankAt<K, fromZero>(a, pr[b], q);
      if constexpr (withE) er[b][c] -= a;
      if constexpr (withO) o[b][c] = fromFloat<T>(s * a);
    }
  }
}

// One row of the same with k at run time (the last rows, and k > 8): the product built in `ar`
// (len floats).
template <bool fromZero, typename T>
inline void lowRankRow(float* __restrict er, T* __restrict o, size_t len, const float* pi, int k,
                       const float* __restrict qt, size_t qld, float s, float* __restrict ar) {
  const float p0 = pi[0];
#pragma omp simd
  for (size_t c = 0; c < len; ++c) ar[c] = fromZero ? 0.f + p0 * qt[c] : p0 * qt[c];
  for (int j = 1; j < k; ++j) {
    const float pij = pi[j];
    const float* __restrict q = qt + size_t(j) * qld;
#pragma omp simd
    for (size_t c = 0; c < len; ++c) ar[c] += pij * q[c];
  }
  if (er) {
#pragma omp simd
    for (size_t c = 0; c < len; ++c) er[c] -= ar[c];
  }
  if (o) {
#pragma omp simd
    for (size_t c = 0; c < len; ++c) o[c] = fromFloat<T>(s * ar[c]);
  }
}

// Over a view: E -= A (withE) and out = s A (withO), A = P Qt^T (Qt: k x v.cols at row stride
// qld). kBlock full rows at a time, then the last rows one by one (and every row when k > 8) by
// the one-row loops: a row's values do not depend on the path it takes. One instantiation per k
// and flags only for the blocks: this file's compile time grows with them.
template <bool fromZero, bool withE, bool withO, typename T>
void lowRank(float* e, T* out, const MatrixView& v, const float* p, const float* qt, size_t qld,
             int k, float s) {
  const size_t ld = v.stride(), full = v.fullRows();
  size_t i = 0;
  withK(k, [&](auto K) {
    if constexpr (K > 0) {
      for (; i + kBlock <= full; i += kBlock) {
        float* er[kBlock];
        T* o[kBlock];
        for (int b = 0; b < kBlock; ++b) {
          er[b] = withE ? e + (i + b) * ld : nullptr;
          o[b] = withO ? out + (i + b) * ld : nullptr;
        }
        lowRankBlock<K, kBlock, fromZero, withE, withO>(er, o, v.cols, p + i * k, k, qt, qld, s);
      }
    }
  });
  std::vector<float> ar(i < v.rows ? v.cols : 0);
  for (; i < v.rows; ++i) {
    const size_t len = v.rowLength(i), off = i * ld;
    if (len == 0) break;
    lowRankRow<fromZero>(withE ? e + off : nullptr, withO ? out + off : nullptr, len, p + i * k, k,
                         qt, qld, s, ar.data());
  }
}

// Eight float lanes, whatever the instruction set: two SSE registers in the baseline's code, one
// AVX register in AVX2's. Element-wise operations on it are IEEE per lane, so the lanes' bits do
// not depend on how the compiler splits them. Only ever a local: no function takes one by value or
// returns one (their ABI differs between the two).
typedef float Lanes8 __attribute__((vector_size(32)));
constexpr size_t kLanes = 8;

// The alternating P step's dot products P[r][j0 + j] = M[r] . Qt[j0 + j] for R rows (m[r], len
// elements each) and J columns of P at once (J Qt rows at row stride qld), R x J lanes-vectors in
// registers. The order, the same for every row however it is blocked and under every instruction
// set: element c adds into lane c mod 8 (c = lane, lane + 8, .. from 0) over the whole multiples
// of 8, the rest into lanes 0, 1, .. after them, then the lanes ((0+4)+(2+6))+((1+5)+(3+7)).
template <int R, int J>
inline void dotLanes(const float* const* m, size_t len, const float* __restrict qt, size_t qld,
                     int j0, float* __restrict p, int k) {
  Lanes8 acc[R][J];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) acc[r][j] = Lanes8{};
  const size_t whole = len / kLanes * kLanes;
  for (size_t c = 0; c < whole; c += kLanes) {
    Lanes8 q[J];
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) std::memcpy(&q[j], qt + size_t(j0 + j) * qld + c, sizeof(Lanes8));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      Lanes8 x;
      std::memcpy(&x, m[r] + c, sizeof(Lanes8));
#pragma GCC unroll 2
      for (int j = 0; j < J; ++j) acc[r][j] += x * q[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      float a[kLanes];
      std::memcpy(a, &acc[r][j], sizeof a);
      const float* q = qt + size_t(j0 + j) * qld;
      for (size_t c = whole; c < len; ++c) a[c - whole] += m[r][c] * q[c];
      p[size_t(r) * k + j0 + j] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    }
}

// Columns j0 .. k-1 of P (all k by default) for R rows: two columns a sweep (R = 4: 8
// lanes-vectors of sums, with 4 of M and 2 of Qt, within AVX2's 16 registers), a last single one
// when k - j0 is odd.
template <int R>
inline void dotRows(const float* const* m, size_t len, const float* qt, size_t qld, int k,
                    float* p, int j0 = 0) {
  for (; j0 + 2 <= k; j0 += 2) dotLanes<R, 2>(m, len, qt, qld, j0, p, k);
  if (j0 < k) dotLanes<R, 1>(m, len, qt, qld, j0, p, k);
}

// Rows of the fused P step after a Q step (pRowsAfterQ) at once: 4 rows x k sums in lanes, the
// best of 1, 2, 4 and 8 rows at k = 1..8 here (fewer reload the 2k rows of Q per row; 8 spill).
constexpr int kPRows = 4;

typedef int32_t Ints8 __attribute__((vector_size(32)));

// The alternating P step's first sweep of R rows (len elements each; E rows e, G rows g) after a
// Q step that left its residual: E holds that step's M, p the rows' k values of its P, qk (K rows
// at stride qld) its own Q. Per 8 columns: M = G + (E - P qk^T), the residual's product by
// lowRankAt as its own sweep takes it, written to E and counted beyond the limit; then added into
// the rows' dot products with qt in dotLanes' order, which write p. One read of the rows where the
// residual's sweep and dotRows' two sweeps read them three times: same operations, same bits.
// Only P's first J columns are summed here (J = 2: 4 x 2 lanes-vectors of sums; 4 x 4 spilled
// half of them at every 8 columns, 200 instructions where this takes 107); dotRows adds the others
// from the rows, in cache by then (pStepRows).
template <int K, int R, int J>
inline void pRowsAfterQ(const float* const* g, float* const* e, size_t len, int k,
                        const float* __restrict qk, const float* __restrict qt, size_t qld,
                        float* p, size_t* bad, uint32_t lim) {
  float pr[R][K];
  Lanes8 acc[R][J];
  for (int b = 0; b < R; ++b)
    for (int j = 0; j < K; ++j) pr[b][j] = p[size_t(b) * k + j];
  for (int b = 0; b < R; ++b)
    for (int j = 0; j < J; ++j) acc[b][j] = Lanes8{};
  const Ints8 limv = Ints8{} + int32_t(lim), magnitude = Ints8{} + 0x7fffffff;
  Ints8 over = {};
  const size_t whole = len / kLanes * kLanes;
  for (size_t c = 0; c < whole; c += kLanes) {
    Lanes8 q[K], d[J];
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) std::memcpy(&q[j], qk + size_t(j) * qld + c, sizeof(Lanes8));
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) std::memcpy(&d[j], qt + size_t(j) * qld + c, sizeof(Lanes8));
#pragma GCC unroll 4
    for (int b = 0; b < R; ++b) {
      Lanes8 gx, ex, a;
      std::memcpy(&gx, g[b] + c, sizeof(Lanes8));
      std::memcpy(&ex, e[b] + c, sizeof(Lanes8));
      lowRankAt<K, true>(a, pr[b], q);
      const Lanes8 x = gx + (ex - a);
      std::memcpy(e[b] + c, &x, sizeof(Lanes8));
      Ints8 u;
      std::memcpy(&u, &x, sizeof u);
      over -= (u & magnitude) >= limv;  // -1 where beyond
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[b][j] += x * d[j];
    }
  }
  size_t n = 0;
  for (size_t l = 0; l < kLanes; ++l) n += uint32_t(over[l]);
  for (int b = 0; b < R; ++b) {
    float s[J][kLanes];
    std::memcpy(s, acc[b], sizeof s);
    for (size_t c = whole; c < len; ++c) {
      float q[K], a;
      for (int j = 0; j < K; ++j) q[j] = qk[size_t(j) * qld + c];
      lowRankAt<K, true>(a, pr[b], q);
      const float x = g[b][c] + (e[b][c] - a);
      e[b][c] = x;
      n += beyond(x, lim);
      for (int j = 0; j < J; ++j) s[j][c - whole] += x * qt[size_t(j) * qld + c];
    }
    for (int j = 0; j < J; ++j) {
      const float* t = s[j];
      p[size_t(b) * k + j] = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    }
  }
  *bad += n;
}

// The rows of a P computation's first sweep (PowerSGD's pass 1 and the alternating P step): M =
// G + E (E += G in place, counting elements beyond the limit; without E, M is G, converted when
// not float32), kBlock rows at a time, then the rows after them one by one. blockDots(m, pi)
// writes the k values of P of the kBlock rows m (v.cols each) from pi on, rowDots(mi, len, pi)
// those of one row of len elements. Returns the count beyond the limit.
// pendingQt (with e; the alternating P step after a Q step that left its residual, k > 8: fewer
// go through pStepAfterQ): E holds that step's M, p its P (rows x k), pendingQt its own Q (k x
// v.cols, stride v.cols): M = G + (E - P pendingQt^T), each row's P read before the dots
// overwrite it.
template <typename T, typename Block, typename Row>
size_t sweepRowsOfM(const T* __restrict g, float* __restrict e, const MatrixView& v, int k,
                    float* p, uint32_t lim, Block&& blockDots, Row&& rowDots,
                    const float* pendingQt = nullptr) {
  size_t bad = 0;
  std::vector<float> rows(rowScratch<T>(e, v));
  std::vector<float> ar(pendingQt ? v.cols : 0);
  const size_t full = v.fullRows(), ld = v.stride();
  // One row after a Q step, any k: its residual (as lowRank's one-row path), then G added.
  auto afterQ = [&](size_t i) {
    const size_t len = v.rowLength(i);
    lowRankRow<true, float>(e + i * ld, nullptr, len, p + i * k, k, pendingQt, v.cols, 1.f,
                            ar.data());
    return rowOfM<T, true>(g, e, v, i, 0, rows.data(), &bad, lim);
  };
  size_t i = 0;
  for (; i + kBlock <= full; i += kBlock) {
    const float* m[kBlock];
    if (pendingQt) {
      for (int b = 0; b < kBlock; ++b) m[b] = afterQ(i + b);
    } else {
      for (int b = 0; b < kBlock; ++b)
        m[b] = rowOfM<T, true>(g, e, v, i + b, b, rows.data(), &bad, lim);
    }
    blockDots(m, p + i * k);
  }
  for (; i < v.rows; ++i) {
    const float* mi =
        pendingQt ? afterQ(i) : rowOfM<T, true>(g, e, v, i, 0, rows.data(), &bad, lim);
    rowDots(mi, v.rowLength(i), p + i * k);
  }
  return bad;
}

// The alternating P step's first sweep: P = M Qt^T in fixed lanes (dotRows).
template <typename T>
size_t pass1Lanes(const T* g, float* e, const MatrixView& v, const float* qt, int k, float* p,
                  uint32_t lim, const float* pendingQt) {
  return sweepRowsOfM(
      g, e, v, k, p, lim,
      [&](const float* const* m, float* pi) { dotRows<kBlock>(m, v.cols, qt, v.cols, k, pi); },
      [&](const float* mi, size_t len, float* pi) {
        const float* m[1] = {mi};
        dotRows<1>(m, len, qt, v.cols, k, pi);
      },
      pendingQt);
}

// The whole alternating P step after a Q step that left its residual (pendingQt), k <= 8, kPRows
// rows at a time while they are in cache: pRowsAfterQ's sweep, the rows' P rounded as the send will
// (roundTo `wire`), then their own residual E -= P Qt^T by lowRankBlock, the residual sweep's code.
// P's columns after the first 2 are summed by dotRows from the rows of M the sweep left in E.
// The last rows (fewer than kPRows, or short) take the same steps by the row-by-row paths
// (sweepRowsOfM, lowRank), which give the same bits. Returns the count beyond the limit.
template <typename T>
size_t pStepRows(const T* g, float* e, const MatrixView& v, const float* qt, int k, float* p,
                 uint32_t lim, const float* pendingQt, lowrankDataType_t wire) {
  const size_t ld = v.stride(), full = v.fullRows();
  size_t bad = 0, i = 0;
  // G not float32: each block's rows converted first (rowOfM without E: toFloat into the row
  // scratch, exact), so that the sweep is compiled once per k, not once per dtype.
  static_assert(kPRows <= kBlock, "rowScratch holds kBlock rows");
  std::vector<float> rows(rowScratch<T>(nullptr, v));
  withK(k, [&](auto K) {
    if constexpr (K > 0) {
      for (; i + kPRows <= full; i += kPRows) {
        const float* gb[kPRows];
        float* eb[kPRows];
        for (int b = 0; b < kPRows; ++b) {
          eb[b] = e + (i + b) * ld;
          gb[b] = rowOfM<T, false>(g, nullptr, v, i + b, b, rows.data(), nullptr, lim);
        }
        float* pi = p + i * k;
        constexpr int J = K < 2 ? K : 2;  // P's columns summed in the sweep; the rest from cache
        pRowsAfterQ<K, kPRows, J>(gb, eb, v.cols, k, pendingQt, qt, v.cols, pi, &bad, lim);
        if (J < K) dotRows<kPRows>(eb, v.cols, qt, v.cols, k, pi, J);
        roundTo(wire, pi, size_t(kPRows) * k);
        lowRankBlock<K, kPRows, true, true, false, float>(eb, nullptr, v.cols, pi, k, qt, v.cols,
                                                          1.f);
      }
    }
  });
  if (i < v.rows) {
    const MatrixView rest = v.rowsFrom(i, v.rows - i);
    if (rest.valid > 0) {
      const size_t at = i * ld;
      bad += pass1Lanes(g + at, e + at, rest, qt, k, p + i * k, lim, pendingQt);
      roundTo(wire, p + i * k, rest.rows * size_t(k));
      lowRank<true, true, false, float>(e + at, nullptr, rest, p + i * k, qt, v.cols, k, 1.f);
    } else {  // rows of padding alone: M's rows are 0, so are their P (not the last step's values)
      std::fill(p + i * k, p + v.rows * k, 0.f);
    }
  }
  return bad;
}

size_t pStepAfterQ(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
                   const float* qt, int k, float* p, float limit, const float* pendingQt,
                   lowrankDataType_t wire) {
  const uint32_t lim = limitBits(limit);
  auto run = [&](auto* gt) { return pStepRows(gt, e, v, qt, k, p, lim, pendingQt, wire); };
  switch (dtype) {
    case lowrankFloat16: return run(static_cast<const half_t*>(g));
    case lowrankBfloat16: return run(static_cast<const bf16_t*>(g));
    default: return run(static_cast<const float*>(g));
  }
}

// The table's entries: the dtype of G or of the output picked at run time.
size_t qOfRows(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v, const float* p,
               int k, float* qt, bool add, float limit) {
  size_t bad = 0;
  const uint32_t lim = limitBits(limit);
  auto run = [&](auto* gt) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(gt)>>;
    if (add) pass2<T, true>(gt, e, v, p, k, qt, &bad, lim);
    else pass2<T, false>(gt, e, v, p, k, qt);
  };
  switch (dtype) {
    case lowrankFloat16: run(static_cast<const half_t*>(g)); break;
    case lowrankBfloat16: run(static_cast<const bf16_t*>(g)); break;
    default: run(static_cast<const float*>(g)); break;
  }
  return bad;
}

size_t pOfRows(const void* g, lowrankDataType_t dtype, float* e, const MatrixView& v,
               const float* qt, int k, float* p, float limit, const float* pendingQt) {
  const uint32_t lim = limitBits(limit);
  auto run = [&](auto* gt) { return pass1Lanes(gt, e, v, qt, k, p, lim, pendingQt); };
  switch (dtype) {
    case lowrankFloat16: return run(static_cast<const half_t*>(g));
    case lowrankBfloat16: return run(static_cast<const bf16_t*>(g));
    default: return run(static_cast<const float*>(g));
  }
}

void decompress(float* e, const MatrixView& v, const float* p, const float* qbart, int k, float s,
                void* out, lowrankDataType_t dtype) {
  auto run = [&](auto* o) {
    if (e) lowRank<false, true, true>(e, o, v, p, qbart, v.cols, k, s);
    else lowRank<false, false, true>(e, o, v, p, qbart, v.cols, k, s);
  };
  switch (dtype) {
    case lowrankFloat16: return run(static_cast<half_t*>(out));
    case lowrankBfloat16: return run(static_cast<bf16_t*>(out));
    default: return run(static_cast<float*>(out));
  }
}

void residual(float* e, const MatrixView& v, const float* p, const float* qt, size_t qld, int k) {
  lowRank<true, true, false, float>(e, nullptr, v, p, qt, qld, k, 1.f);
}

}  // namespace

const ElementwisePasses kPasses = {&qOfRows, &decompress, &residual, &pOfRows, &pStepAfterQ};

}  // namespace lowrank::host::LR_ISA
