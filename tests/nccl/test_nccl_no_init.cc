// lowrankNcclGetUniqueId and lowrankCommInitNcclRank with an NCCL library that lacks
// ncclGetUniqueId and ncclCommInitRank (LOWRANK_NCCL_LIBRARY = the double built without them,
// libnccl_double_no_init.so, set by meson): lowrankSystemError naming the library and the symbol.
// A process of its own: lowrank resolves its NCCL table once per process. Public C API only.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "lowrank/lowrank_nccl.h"

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(NcclWithoutInit, MissingSymbolsAreNamed) {
  const char* lib = getenv("LOWRANK_NCCL_LIBRARY");
  ASSERT_TRUE(lib && contains(lib, "nccl_double_no_init")) << "run by meson, with LOWRANK_NCCL_LIBRARY set";
  ncclUniqueId id = {};
  EXPECT_EQ(lowrankNcclGetUniqueId(&id), lowrankSystemError);
  std::string err = lowrankGetLastError(nullptr);
  EXPECT_TRUE(contains(err, "lowrankNcclGetUniqueId: ")) << err;
  EXPECT_TRUE(contains(err, lib)) << err;
  EXPECT_TRUE(contains(err, "LOWRANK_NCCL_LIBRARY")) << err;
  EXPECT_TRUE(contains(err, "has no symbol ncclGetUniqueId")) << err;

  lowrankComm_t comm = reinterpret_cast<lowrankComm_t>(0x1);
  EXPECT_EQ(lowrankCommInitNcclRank(&comm, 1, id, 0, nullptr), lowrankSystemError);
  EXPECT_EQ(comm, nullptr);
  err = lowrankGetLastError(nullptr);
  EXPECT_TRUE(contains(err, "lowrankCommInitNcclRank: ")) << err;
  EXPECT_TRUE(contains(err, lib)) << err;
  EXPECT_TRUE(contains(err, "has no symbol ncclCommInitRank")) << err;

  // Argument errors still come first.
  EXPECT_EQ(lowrankCommInitNcclRank(&comm, 0, id, 0, nullptr), lowrankInvalidArgument);
}

}  // namespace
