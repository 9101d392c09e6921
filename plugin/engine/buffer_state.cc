#include "engine/buffer_state.h"

namespace lowrank {

void BufferState::reset() {
  planned = false;
  plan = Plan();
  // Free the memory, not just the contents: a reset buffer may never be called again.
  std::vector<float>().swap(error);
  std::vector<float>().swap(payload);
  std::vector<float>().swap(qt);
  std::vector<float>().swap(qwire);
  haveQ = false;
  calls = 0;
  exactOnly = false;
}

size_t BufferState::bytes() const {
  return sizeof(float) * (error.capacity() + payload.capacity() + qt.capacity() + qwire.capacity());
}

BufferState* BufferRegistry::find(const void* buf) {
  auto it = map_.find(buf);
  return it == map_.end() ? nullptr : &it->second;
}

size_t BufferRegistry::bytes() const {
  size_t b = 0;
  for (const auto& kv : map_) b += kv.second.bytes();
  return b;
}

}  // namespace lowrank
