// Every host wait on the device, in one place (issue 26): a dead peer leaves NCCL's kernels
// spinning and its events never complete, so no wait may be cudaEventSynchronize or
// cudaStreamSynchronize. A wait polls the event (or stream), NCCL's asynchronous error and the
// comm's abort flag, and gives up at the comm's timeout (LOWRANK_TIMEOUT).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "cuda_backend/cuda_status.h"
#include "cuda_backend/device_schedule.h"

namespace lowrank::cuda {

// A call's wait for `ev` (or, when null, everything queued on `stream`). Errors, each naming
// `phase` ("waiting for the plan check: ..."): lowrankTimeout after dc.timeoutSec (the comm is
// then stuck: teardown waits no more), NCCL's asynchronous error (ncclResult set), lowrankRemoteError
// once the comm was aborted, a CUDA error of the query.
Err waitDevice(const DeviceComm& dc, cudaEvent_t ev, cudaStream_t stream, const char* phase);

// Teardown's wait before freeing (and, once a wait failed, for the communication stream too): true
// once done; false when it did not finish within the timeout (none once a wait timed out; once
// aborted, until the abort's one deadline, a second after the first teardown wait, however many
// buffers wait:
// NCCL's abort ends its kernels, an application's own NCCL comm may still hold them). The caller
// then leaves the memory allocated.
bool settleDevice(const DeviceComm& dc, cudaEvent_t ev, cudaStream_t stream);
// The same bound for any teardown condition: polls done() until true (true) or the bound (false).
bool settleDevice(const DeviceComm& dc, const std::function<bool()>& done);

}  // namespace lowrank::cuda
