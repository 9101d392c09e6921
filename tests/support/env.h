// Test support: environment variables set for a scope and restored after it, and a check that no
// test leaves a LOWRANK_* variable changed. The test setup pins some (meson.build's 'pinned':
// LOWRANK_UCX_PROBE=0, so that communicators choose their algorithms from constants, not timings);
// a test that unset one at its end turned the probe on for every later test in the binary, and
// bit-exact comparisons between communicators then failed at random (TSan's timings, 1 run in 8).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

extern char** environ;

namespace lowrank::testing {

// Sets (or, with value null, unsets) `name` for the guard's scope; restores what was there before.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (was_) setenv(name_.c_str(), was_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> was_;
};

// Every LOWRANK_* variable and its value.
inline std::map<std::string, std::string> lowrankEnv() {
  std::map<std::string, std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("LOWRANK_", 0) == 0 && eq != std::string::npos)
      out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

// Fails the test (a failure outside it: the binary fails) that ends with LOWRANK_* changed.
class EnvUnchanged : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { before_ = lowrankEnv(); }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    const auto after = lowrankEnv();
    if (after == before_) return;
    std::string diff;
    for (const auto& [k, v] : before_)
      if (!after.count(k) || after.at(k) != v)
        diff += " " + k + "='" + v + "' -> " + (after.count(k) ? "'" + after.at(k) + "'" : "unset");
    for (const auto& [k, v] : after)
      if (!before_.count(k)) diff += " " + k + " unset -> '" + v + "'";
    ADD_FAILURE() << t.test_suite_name() << "." << t.name()
                  << " left the environment changed (restore with EnvGuard):" << diff;
    for (const auto& [k, v] : before_) setenv(k.c_str(), v.c_str(), 1);  // the next tests run as set
    for (const auto& [k, v] : after)
      if (!before_.count(k)) unsetenv(k.c_str());
  }
  std::map<std::string, std::string> before_;
};

// Registered once per test binary that includes this header (an inline variable: one instance).
inline const bool kEnvUnchangedRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new EnvUnchanged);
  return true;
}();

}  // namespace lowrank::testing
