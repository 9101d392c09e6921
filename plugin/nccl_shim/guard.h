// The thread-local guard: set while the shim runs code of the real NCCL or of lowrank, so that a
// call that comes back into an interposed entry point on this thread (lowrank's own factor
// allreduces, or the real library calling its exported names) goes straight to the real NCCL.
#pragma once

namespace lowrank::shim {

class Guard {
 public:
  Guard() { ++depth(); }
  ~Guard() { --depth(); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    static thread_local int d = 0;
    return d;
  }
};

}  // namespace lowrank::shim
