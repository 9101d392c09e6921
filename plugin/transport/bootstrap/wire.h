// The bootstrap's wire formats (all integers little-endian), shared by the root's server and the
// comm ranks' clients.
//
// lowrankUniqueId.internal (128 bytes):
//   [0, 8)    kIdMagic
//   [8, 12)   kIdVersion
//   [12, 16)  zero
//   [16, 32)  the root's struct sockaddr_in (AF_INET, port and address in network order)
//   [32, 48)  the 128-bit secret
//   [48, 128) zero
//
// Hello, comm rank -> root:
//   u64 kHelloMagic | u8 secret[16] | u32 rank | u32 nranks | u32 blobLen | blob[blobLen]
// The server reads and checks each part before reading the next: a wrong magic or secret, or an
// implausible rank/nranks/blobLen (nranks in [1, kMaxRanks], rank < nranks, blobLen <= kMaxBlob),
// closes the connection without reading further.
//
// Reply, root -> comm rank:
//   u32 code = 0 | u32 nranks | u32 len[nranks] | blobs concatenated in comm-rank order
//   u32 code = a lowrankResult_t != 0 | u32 msgLen (<= kMaxErrorMsg) | msg[msgLen]
#pragma once
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>

#include "lowrank/lowrank.h"
#include "util/status.h"

namespace lowrank::bootstrap {

inline constexpr uint64_t kIdMagic = 0x3144494b524c4f4cull;     // "LOLRKID1"
inline constexpr uint32_t kIdVersion = 1;
inline constexpr uint64_t kHelloMagic = 0x314f4c4c4548524cull;  // "LRHELLO1"
inline constexpr size_t kSecretBytes = 16;
inline constexpr uint32_t kMaxRanks = 65536;
inline constexpr uint32_t kMaxBlob = 64 * 1024;
inline constexpr uint32_t kMaxErrorMsg = 1024;
inline constexpr size_t kHelloFixedBytes = 8 + kSecretBytes + 12;

struct RootInfo {
  sockaddr_in addr{};
  uint8_t secret[kSecretBytes]{};
};

void encodeUniqueId(const RootInfo& info, lowrankUniqueId* id);
// lowrankInvalidArgument if the id is not one made by makeUniqueId (magic, version, family).
Status decodeUniqueId(const lowrankUniqueId& id, RootInfo* info);

// Constant-time comparison of two secrets.
bool secretEqual(const uint8_t* a, const uint8_t* b);

}  // namespace lowrank::bootstrap
