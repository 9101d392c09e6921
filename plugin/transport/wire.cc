#include "transport/wire.h"

#include <cstring>

#include "util/convert.h"

namespace lowrank::wire {
namespace {

// The three parts of [off, off + len): float32 before lo, 16-bit, float32 from hi on (any empty).
struct Parts {
  size_t before, encoded, after;
  Parts(const Wire& w, size_t off, size_t len) {
    encoded = w.encodedIn(off, len);
    before = encoded ? (w.lo > off ? w.lo - off : 0) : len;
    after = len - before - encoded;
  }
};

template <typename H>
void encodeAs(float* src, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const H h = host::fromFloat<H>(src[i]);
    src[i] = host::toFloat(h);
    out[i] = h.bits;
  }
}

template <typename H>
void decodeAs(const uint16_t* in, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = host::toFloat(H{in[i]});
}

void encode16(lowrankDataType_t t, float* src, size_t n, uint16_t* out) {
  if (t == lowrankBfloat16) encodeAs<host::bf16_t>(src, n, out);
  else encodeAs<host::half_t>(src, n, out);
}

}  // namespace

void encode(const Wire& w, size_t off, size_t len, float* src, void* out) {
  const Parts p(w, off, len);
  auto* o = static_cast<std::byte*>(out);
  std::memcpy(o, src, 4 * p.before);
  o += 4 * p.before;
  // the 16-bit part starts after whole floats of an allocated (aligned) buffer: aligned for uint16
  encode16(w.dtype, src + p.before, p.encoded, reinterpret_cast<uint16_t*>(o));
  o += 2 * p.encoded;
  std::memcpy(o, src + p.before + p.encoded, 4 * p.after);
}

void decode(const Wire& w, size_t off, size_t len, const void* in, float* dst) {
  const Parts p(w, off, len);
  const auto* i = static_cast<const std::byte*>(in);
  std::memcpy(dst, i, 4 * p.before);
  i += 4 * p.before;
  const auto* h = reinterpret_cast<const uint16_t*>(i);
  if (w.dtype == lowrankBfloat16) decodeAs<host::bf16_t>(h, p.encoded, dst + p.before);
  else decodeAs<host::half_t>(h, p.encoded, dst + p.before);
  i += 2 * p.encoded;
  std::memcpy(dst + p.before + p.encoded, i, 4 * p.after);
}

void round(const Wire& w, size_t off, size_t len, float* buf) {
  const Parts p(w, off, len);
  host::roundTo(w.dtype, buf + p.before, p.encoded);
}

}  // namespace lowrank::wire
