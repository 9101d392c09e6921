// 16-bit factors on the wire (LOWRANK_FACTOR_DTYPE): a float32 allreduce whose elements [lo, hi)
// travel as bfloat16 or float16 while every sum is taken in float32. The one place the encoding of
// a message and its length are stated: the UCX exchange encodes and decodes with it, the cost
// model counts its bytes with it, the tests hold lowrankStats_t.bytesSent to it.
//
// The rule (docs/design.md, "16-bit factors"): each send rounds the elements of the range it
// carries in place, once, to the wire dtype (round to nearest even) and sends those 16 bits; the
// receiver converts them back to float32 exactly and adds in float32. Rounding the sender's own copy
// keeps every comm rank's bits the same (what a peer receives is what the sender keeps); before a
// fold sends the result to the extra ranks every core rank rounds it alike (fold.cc). So the ring
// and halving + doubling end with wire values (their allgathers send every block), direct and
// recursive doubling with the float32 sum of wire values (direct: each contribution rounded once
// and nothing more), the same bits on every comm rank. Outside [lo, hi) (the exact part, the
// payload's check words) elements travel as float32, untouched.
#pragma once
#include <cstddef>
#include <cstdint>

#include "lowrank/lowrank.h"
#include "util/dtype.h"

namespace lowrank {

struct Wire {
  lowrankDataType_t dtype = lowrankFloat32;  // lowrankBfloat16 or lowrankFloat16 for a 16-bit part
  size_t lo = 0, hi = 0;                      // the 16-bit part, elements of the float32 buffer

  bool active() const { return dtype != lowrankFloat32 && hi > lo; }
  // Elements of [off, off + len) inside [lo, hi).
  size_t encodedIn(size_t off, size_t len) const {
    if (!active()) return 0;
    const size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
    return b > a ? b - a : 0;
  }
  // Bytes on the wire of the float32 elements [off, off + len).
  uint64_t bytes(size_t off, size_t len) const { return 4 * uint64_t(len) - 2 * uint64_t(encodedIn(off, len)); }
};

namespace wire {

// Encodes float32 elements [off, off + len) of the buffer (src points at element off) into `out`
// (wire.bytes(off, len) bytes): float32 as is outside [lo, hi), 16 bits inside, each rounded in
// src too.
void encode(const Wire& w, size_t off, size_t len, float* src, void* out);
// Decodes a message of elements [off, off + len) into float32 at dst.
void decode(const Wire& w, size_t off, size_t len, const void* in, float* dst);
// Rounds the elements of [lo, hi) among [off, off + len) in place (buf points at element off).
void round(const Wire& w, size_t off, size_t len, float* buf);

using lowrank::factorDtypeName;  // util/dtype.h

}  // namespace wire
}  // namespace lowrank
