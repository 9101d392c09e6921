// The 64-bit UCX tag of every transport message, matched with a full mask:
//
//   bits 63..48  the sender's comm rank (16 bits: comm ranks < 65536, the bootstrap's limit)
//   bits 47..32  the transport's collective sequence number, mod 2^16 (0 = the creation handshake,
//                collectives are numbered from 1). Ranks are never more than one collective apart
//                (each needs a message from every rank), so the wrap is harmless.
//   bits 31..0   the message index inside the collective (ring: step * nchunks + chunk; direct: 0)
//
// so that a message of one collective, step or chunk can never match the receive of another.
#pragma once
#include <cstdint>

namespace lowrank::ucx {

inline uint64_t makeTag(int sender, uint32_t seq, uint32_t index) {
  return (uint64_t(uint16_t(sender)) << 48) | (uint64_t(seq & 0xffffu) << 32) | uint64_t(index);
}
inline constexpr uint64_t kTagMaskFull = ~uint64_t(0);

}  // namespace lowrank::ucx
