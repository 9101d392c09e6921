// The TCP rendezvous (plugin/transport/bootstrap).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/env.h"
#include "tests/transport/support.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/socket.h"
#include "transport/bootstrap/wire.h"

namespace lowrank::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs allgatherBlobs on ranks[i] (with nranks[i]) on one thread each.
std::vector<Status> gather(const lowrankUniqueId& id, const std::vector<int>& ranks,
                           const std::vector<int>& nranks, const std::vector<std::string>& blobs,
                           double timeout, std::vector<std::vector<std::string>>* out) {
  std::vector<Status> sts(ranks.size());
  out->assign(ranks.size(), {});
  test::runRanks(int(ranks.size()), [&](int i) {
    sts[size_t(i)] = allgatherBlobs(id, ranks[size_t(i)], nranks[size_t(i)], blobs[size_t(i)], timeout,
                                    &(*out)[size_t(i)]);
  });
  return sts;
}

// A raw connection to the root of `id`.
Fd connectRaw(const lowrankUniqueId& id) {
  RootInfo info;
  EXPECT_TRUE(decodeUniqueId(id, &info).ok());
  Fd fd;
  int err = 0;
  EXPECT_EQ(connectRetry(info.addr, Deadline(5), &fd, &err), Io::Ok);
  return fd;
}

// True if the peer closes the connection within `seconds` (reads and discards anything it sends).
bool closedByPeer(int fd, double seconds) {
  auto t0 = Clock::now();
  while (since(t0) < seconds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char c[64];
    ssize_t r = ::recv(fd, c, sizeof c, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

std::vector<uint8_t> hello(const uint8_t* secret, uint32_t rank, uint32_t nranks, uint32_t blobLen) {
  std::vector<uint8_t> h(kHelloFixedBytes);
  putU64(h.data(), kHelloMagic);
  std::memcpy(h.data() + 8, secret, kSecretBytes);
  putU32(h.data() + 24, rank);
  putU32(h.data() + 28, nranks);
  putU32(h.data() + 32, blobLen);
  return h;
}

TEST(Bootstrap, AllgatherBlobsOfManySizes) {
  lowrankUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id, 10).ok());
  const int n = 5;
  std::vector<std::string> blobs = {"", "a", std::string(kMaxBlob, 'x'), "hello world",
                                    std::string(1000, '\0')};
  blobs[4][7] = 'z';
  std::vector<std::vector<std::string>> out;
  auto sts = gather(id, {0, 1, 2, 3, 4}, std::vector<int>(n, n), blobs, 10, &out);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(sts[size_t(r)].ok()) << sts[size_t(r)].msg;
    EXPECT_EQ(out[size_t(r)], blobs) << "comm rank " << r;
  }
}

TEST(Bootstrap, IdEncodesTheRootAndASecret) {
  lowrankUniqueId a, b;
  ASSERT_TRUE(makeUniqueId(&a, 0.5).ok());
  ASSERT_TRUE(makeUniqueId(&b, 0.5).ok());
  RootInfo ia, ib;
  ASSERT_TRUE(decodeUniqueId(a, &ia).ok());
  ASSERT_TRUE(decodeUniqueId(b, &ib).ok());
  EXPECT_EQ(ia.addr.sin_family, AF_INET);
  EXPECT_NE(ia.addr.sin_port, 0);
  EXPECT_NE(ia.addr.sin_port, ib.addr.sin_port);
  EXPECT_FALSE(secretEqual(ia.secret, ib.secret));
  lowrankUniqueId bad = a;
  bad.internal[0] ^= 1;
  std::vector<std::string> all;
  EXPECT_EQ(allgatherBlobs(bad, 0, 1, "", 1, &all).code, lowrankInvalidArgument);
  EXPECT_EQ(allgatherBlobs(a, 2, 2, "", 1, &all).code, lowrankInvalidArgument);
  EXPECT_EQ(allgatherBlobs(a, 0, 1, std::string(kMaxBlob + 1, 'x'), 1, &all).code, lowrankInvalidArgument);
}

TEST(Bootstrap, RefusesBadPeersAndStillForms) {
  lowrankUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id, 10).ok());
  RootInfo info;
  ASSERT_TRUE(decodeUniqueId(id, &info).ok());
  int err = 0;
  Deadline dl(5);

  Fd silent = connectRaw(id);  // connects and sends nothing: must not hold up anyone
  Fd partial = connectRaw(id);  // a valid magic, then stalls
  uint8_t magic[8];
  putU64(magic, kHelloMagic);
  ASSERT_EQ(writeFull(partial.get(), magic, 8, dl, &err), Io::Ok);

  Fd wrongSecret = connectRaw(id);
  uint8_t secret[kSecretBytes];
  std::memcpy(secret, info.secret, kSecretBytes);
  secret[3] ^= 0x40;
  auto h = hello(secret, 0, 2, 4);
  ASSERT_EQ(writeFull(wrongSecret.get(), h.data(), h.size(), dl, &err), Io::Ok);

  Fd garbage = connectRaw(id);
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(writeFull(garbage.get(), junk.data(), junk.size(), dl, &err), Io::Ok);

  Fd oversized = connectRaw(id);  // right secret, implausible blob length
  h = hello(info.secret, 0, 2, kMaxBlob + 1);
  ASSERT_EQ(writeFull(oversized.get(), h.data(), h.size(), dl, &err), Io::Ok);

  Fd badRank = connectRaw(id);  // right secret, rank >= nranks
  h = hello(info.secret, 5, 2, 0);
  ASSERT_EQ(writeFull(badRank.get(), h.data(), h.size(), dl, &err), Io::Ok);

  EXPECT_TRUE(closedByPeer(wrongSecret.get(), 3)) << "wrong secret not refused";
  EXPECT_TRUE(closedByPeer(garbage.get(), 3)) << "garbage not refused";
  EXPECT_TRUE(closedByPeer(oversized.get(), 3)) << "oversized blob not refused";
  EXPECT_TRUE(closedByPeer(badRank.get(), 3)) << "rank >= nranks not refused";

  std::vector<std::vector<std::string>> out;
  auto t0 = Clock::now();
  auto sts = gather(id, {1, 0}, {2, 2}, {"one", "zero"}, 5, &out);
  EXPECT_LT(since(t0), 3.0);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(sts[i].ok()) << sts[i].msg;
    EXPECT_EQ(out[i], (std::vector<std::string>{"zero", "one"}));
  }
  EXPECT_TRUE(closedByPeer(silent.get(), 3));  // the server is done and closed everything
}

TEST(Bootstrap, NranksMismatchFailsEveryone) {
  lowrankUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id, 10).ok());
  std::vector<std::vector<std::string>> out;
  auto t0 = Clock::now();
  auto sts = gather(id, {0, 1}, {2, 3}, {"a", "b"}, 10, &out);
  EXPECT_LT(since(t0), 5.0);
  for (auto& st : sts) {
    EXPECT_EQ(st.code, lowrankRemoteError) << st.msg;
    EXPECT_NE(st.msg.find("nranks"), std::string::npos) << st.msg;
  }
}

TEST(Bootstrap, DuplicateRankFailsEveryone) {
  lowrankUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id, 10).ok());
  std::vector<std::vector<std::string>> out;
  auto sts = gather(id, {1, 1}, {3, 3}, {"a", "b"}, 10, &out);
  for (auto& st : sts) {
    EXPECT_EQ(st.code, lowrankRemoteError) << st.msg;
    EXPECT_NE(st.msg.find("twice"), std::string::npos) << st.msg;
  }
}

TEST(Bootstrap, TimesOutWhenARankNeverArrives) {
  lowrankUniqueId id;
  ASSERT_TRUE(makeUniqueId(&id, 1.0).ok());
  std::vector<std::vector<std::string>> out;
  auto t0 = Clock::now();
  auto sts = gather(id, {0, 2}, {3, 3}, {"a", "c"}, 1.0, &out);
  double took = since(t0);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 4.0);
  for (auto& st : sts) EXPECT_EQ(st.code, lowrankTimeout) << st.msg;
}

TEST(Bootstrap, SocketIfnameIsValidated) {
  lowrankUniqueId id;
  Status st;
  {
    lowrank::testing::EnvGuard bad("LOWRANK_SOCKET_IFNAME", "nosuchif0");
    st = makeUniqueId(&id, 1);
  }
  EXPECT_EQ(st.code, lowrankInvalidUsage);
  EXPECT_NE(st.msg.find("LOWRANK_SOCKET_IFNAME"), std::string::npos) << st.msg;
  {
    lowrank::testing::EnvGuard lo("LOWRANK_SOCKET_IFNAME", "lo");
    st = makeUniqueId(&id, 5);
  }
  ASSERT_TRUE(st.ok()) << st.msg;
  RootInfo info;
  ASSERT_TRUE(decodeUniqueId(id, &info).ok());
  EXPECT_EQ(ntohl(info.addr.sin_addr.s_addr), uint32_t(INADDR_LOOPBACK));
  std::vector<std::string> all;
  st = allgatherBlobs(id, 0, 1, "solo", 5, &all);
  ASSERT_TRUE(st.ok()) << st.msg;
  EXPECT_EQ(all, std::vector<std::string>{"solo"});
  EXPECT_EQ(makeUniqueId(&id, 0).code, lowrankInvalidArgument);
}

}  // namespace
}  // namespace lowrank::bootstrap
