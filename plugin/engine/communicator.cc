// deleteComm: the end of a communicator, and of the NCCL communicator it owns.
#include "engine/communicator.h"

#include "platform/cuda_probe.h"
#include "platform/nccl.h"

namespace lowrank {

Status deleteComm(lowrankComm* comm) {
  void* owned = comm->ownsNccl ? comm->ncclComm : nullptr;
  const bool abort = comm->aborted;
  delete comm;  // buffer states, backends and transport: all of them use the NCCL comm
  if (!owned) return Status::Ok();
  const nccl::Api* api = nullptr;
  LR_RETURN_IF_ERROR(nccl::realNccl(&api));  // resolved already: the NCCL comm was made through it
  return abort ? nccl::fromNccl(*api, api->commAbort(owned), "ncclCommAbort")
               : nccl::fromNccl(*api, api->commDestroy(owned), "ncclCommDestroy");
}

}  // namespace lowrank

namespace lowrank {
namespace {

// The communicator's device, made current while its device buffers' states are collected or freed
// (-1: no device buffers, nothing changes).
int deviceOf(const lowrankComm* comm) { return comm->device ? comm->device->device() : -1; }

}  // namespace

void setLayout(lowrankComm* comm, const void* buf, Layout layout) {
  platform::DeviceGuard guard(deviceOf(comm));
  Buffer& b = comm->buffers.get(buf);
  comm->buffers.reset(buf, b, comm->counters);
  b.layout = std::move(layout);
}

void resetBuffer(lowrankComm* comm, const void* buf) {
  platform::DeviceGuard guard(deviceOf(comm));
  if (Buffer* b = comm->buffers.find(buf)) comm->buffers.reset(buf, *b, comm->counters);
}

void releaseBuffer(lowrankComm* comm, const void* buf) {
  platform::DeviceGuard guard(deviceOf(comm));
  comm->buffers.erase(buf, comm->counters);
}

void viewBuffer(lowrankComm* comm, const void* buf, lowrankBufferView_t* view) {
  *view = lowrankBufferView_t{};
  const Buffer* b = comm->buffers.find(buf);
  if (b && b->planned) describePlan(b->plan, b->calls, view);
}

void getStats(lowrankComm* comm, lowrankStats_t* stats) {
  if (comm->device) {  // the device's checks that have arrived count now
    platform::DeviceGuard guard(deviceOf(comm));
    comm->buffers.collectArrived(*comm->device, comm->counters);
  }
  const Counters& c = comm->counters;
  *stats = lowrankStats_t{};
  stats->calls = c.calls;
  stats->compressedCalls = c.compressedCalls;
  stats->fallbackCalls = c.fallbackCalls;
  stats->compressedElements = c.compressedElements;
  stats->exactElements = c.exactElements;
  stats->payloadElements = c.payloadElements;
  const auto& t = comm->transport->counters();
  stats->elementsSent = t.elementsSent.load();
  stats->bytesSent = t.bytesSent.load();
  stats->ratio = c.payloadElements
                     ? double(c.compressedElements + c.exactElements) / double(c.payloadElements)
                     : 0.0;
  stats->stateBytes = comm->buffers.stateBytes();
  stats->buffers = comm->buffers.size();
}

}  // namespace lowrank
