// Layout hints (lowrankNcclSetBucketLayout in lowrank_nccl.h): the tensor shapes packed in a
// bucket buffer, kept per recvbuff for every communicator, and given to lowrank
// (lowrankBufferSetLayout) at the buffer's next compressed call on each communicator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lowrank::shim {

struct LayoutHint {
  uint64_t version = 0;     // changes when the layout of the buffer changes
  std::vector<int> ndims;   // per tensor
  std::vector<size_t> dims; // all tensors' sizes, concatenated
  size_t elements = 0;      // sum over tensors of the product of their sizes
};

// The hint for recvbuff, or null.
std::shared_ptr<const LayoutHint> layoutHint(const void* recv);

}  // namespace lowrank::shim
