// lowrankGetBuildInfo against git itself, run here at test time (not the build's generator): the
// revision is the checkout's HEAD, the dirty flag says whether git sees the library's sources
// changed. LOWRANK_TEST_SOURCE_ROOT (set by meson) names the checkout the library was built from;
// `meson test` rebuilds the library first, so both see the same tree.
#include <gtest/gtest.h>
#include <lowrank/lowrank.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// stdout of a shell command (stderr dropped), trailing newline removed; `ok` false if it failed.
std::string shell(const std::string& cmd, bool* ok) {
  std::string out;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) {
    *ok = false;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *ok = pclose(p) == 0;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool isHex(const std::string& s, size_t len) {
  return s.size() == len && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(BuildInfo, FormatAndNullArguments) {
  const char* revision = nullptr;
  const char* digest = nullptr;
  int dirty = 7;
  ASSERT_EQ(lowrankGetBuildInfo(&revision, &dirty, &digest), lowrankSuccess);
  ASSERT_NE(revision, nullptr);
  ASSERT_NE(digest, nullptr);
  EXPECT_TRUE(isHex(revision, 40) || std::string(revision) == "unknown") << revision;
  EXPECT_TRUE(dirty == 0 || dirty == 1 || dirty == -1) << dirty;
  EXPECT_TRUE(isHex(digest, 64)) << digest;
  EXPECT_EQ(lowrankGetBuildInfo(nullptr, nullptr, nullptr), lowrankSuccess);
  const char* again = nullptr;
  EXPECT_EQ(lowrankGetBuildInfo(&again, nullptr, nullptr), lowrankSuccess);
  EXPECT_EQ(again, revision) << "the strings are static";
}

TEST(BuildInfo, MatchesTheCheckout) {
  const char* root = std::getenv("LOWRANK_TEST_SOURCE_ROOT");
  if (!root || !*root) GTEST_SKIP() << "LOWRANK_TEST_SOURCE_ROOT unset";
  const std::string git = std::string("git --no-optional-locks -C '") + root + "' ";
  bool ok = false;
  std::string top = shell(git + "rev-parse --show-toplevel", &ok);
  char* real_top = ok ? realpath(top.c_str(), nullptr) : nullptr;
  char* real_root = realpath(root, nullptr);
  bool checkout = real_top && real_root && std::strcmp(real_top, real_root) == 0;
  std::free(real_top);
  std::free(real_root);
  if (!checkout) GTEST_SKIP() << root << " is not a git checkout of its own (or git is missing)";

  const char* revision = nullptr;
  int dirty = -2;
  ASSERT_EQ(lowrankGetBuildInfo(&revision, &dirty, nullptr), lowrankSuccess);
  std::string head = shell(git + "rev-parse HEAD", &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(std::string(revision), head);
  // Changed, deleted or untracked (not ignored) files among the library's sources.
  std::string changes = shell(git + "status --porcelain --untracked-files=all -- plugin kernels "
                                    "include ':(glob)**/meson.build' ':(glob)**/meson_options.txt'",
                              &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(dirty, changes.empty() ? 0 : 1) << "git status of the sources:\n" << changes;
}

}  // namespace
