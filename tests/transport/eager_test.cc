// Where lowrank's UCX context sends eager (transport/ucx/eager.h): TCP only, and the user's
// UCX_RNDV_THRESH left alone.
#include <gtest/gtest.h>

#include <cstring>

#include "transport/ucx/eager.h"

namespace lowrank::ucx {
namespace {

TEST(Eager, TcpOnlyByTheTransportList) {
  EXPECT_TRUE(tcpOnly("tcp", true));
  EXPECT_TRUE(tcpOnly("tcp,self", true));  // the studies' setting, even on a host with RDMA
  EXPECT_TRUE(tcpOnly("tcp,sm,self", true));
  EXPECT_FALSE(tcpOnly("rc,tcp", false));  // an RDMA transport named: never assumed absent
  EXPECT_FALSE(tcpOnly("ud_x,self", false));
  EXPECT_FALSE(tcpOnly("cuda_ipc,tcp", false));
  EXPECT_FALSE(tcpOnly("tcpx", false));  // unknown names are not TCP
  EXPECT_TRUE(tcpOnly("tcp,mm,self", true));  // mm: UCX's alias of the shared-memory ones
  EXPECT_FALSE(tcpOnly("sm,self", false));    // no network transport at all: not "TCP only"
}

TEST(Eager, AllOrNegatedListsDependOnTheHostsDevices) {
  for (const char* tls : {"", "all", "^rc", "^sm"}) {
    EXPECT_TRUE(tcpOnly(tls, false)) << tls;
    EXPECT_FALSE(tcpOnly(tls, true)) << tls;
  }
}

TEST(Eager, TheUsersThresholdWins) {
  EXPECT_STREQ(rendezvousThreshold(nullptr, "tcp,self", false), "inf");
  EXPECT_STREQ(rendezvousThreshold("", "", false), "inf");  // empty counts as unset
  EXPECT_EQ(rendezvousThreshold("64k", "tcp,self", false), nullptr);
  EXPECT_EQ(rendezvousThreshold(nullptr, "", true), nullptr);  // maybe RDMA: UCX's own
  EXPECT_EQ(rendezvousThreshold(nullptr, "rc,self", false), nullptr);
}

}  // namespace
}  // namespace lowrank::ucx
