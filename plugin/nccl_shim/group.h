// Groups: ncclGroupStart/End nest per thread. An allreduce the shim compresses, made inside a
// group, cannot join NCCL's group (lowrank runs several collectives of its own): it is recorded
// and run, in call order, right after the outermost real ncclGroupEnd. Calls passed through go
// to NCCL inside the group as usual. (XLA wraps every allreduce in a group, so without this JAX
// would never be compressed.)
#pragma once
#include <nccl.h>

#include <memory>
#include <vector>

namespace lowrank::shim {

struct ShimComm;

struct RecordedCall {
  std::shared_ptr<ShimComm> comm;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  int op = 0;  // the lowrank op (sum or avg) the call maps to
  cudaStream_t stream = nullptr;
};

namespace group {
int depth();                           // the calling thread's group depth
void start();                          // ncclGroupStart
bool end();                            // ncclGroupEnd: true when it closed the outermost group
void record(RecordedCall call);        // inside a group
std::vector<RecordedCall> takeRecorded();  // the calling thread's recorded calls, in order
}  // namespace group

}  // namespace lowrank::shim
