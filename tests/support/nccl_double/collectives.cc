// The NCCL test double's collectives, all built on lowrankAllReduce (exact: approxRank 0):
//   allreduce       lowrankAllReduce with the same dtype and op (NCCL's numbering is lowrank's);
//   premulsum       each rank's input times its scalar, then a sum;
//   broadcast       bytes: the root's data, zeros elsewhere, allreduced with max over uint8;
//   allgather       bytes: each rank's block in its slot, zeros elsewhere, max over uint8;
//   reducescatter   allreduce into scratch, then this rank's block;
//   reduce          allreduce into scratch, copied out on the root.
// Max over uint8 against zeros gives every byte back unchanged, so broadcast and allgather move
// any dtype bit for bit (NaN payloads, -0.0 included).
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "double.h"
#ifdef NCCL_DOUBLE_ON_STREAMS
#include "gpu/emu/host_work.h"  // pointerDevice
#endif
#include "util/convert.h"

namespace nccl_double {
namespace {

using lowrank::host::bf16_t;
using lowrank::host::half_t;

ncclResult_t checkComm(ncclComm_t comm, const char* what) {
  if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", what);
  return ncclSuccess;
}

// count * size of dtype, refusing an overflow.
ncclResult_t byteCount(size_t count, ncclDataType_t dtype, size_t mult, const char* what, size_t* out) {
  const size_t es = dtypeSize(dtype);
  if (count > SIZE_MAX / es / mult) return fail(ncclInvalidArgument, "%s: count %zu overflows", what, count);
  *out = count * es * mult;
  return ncclSuccess;
}

// Counts a collective in flight, so that ncclCommAbort frees the comm only after it returned.
struct InFlight {
  explicit InFlight(ncclComm_t c) : comm(c) { ++comm->inflight; }
  ~InFlight() { --comm->inflight; }  // the call's last touch of *comm
  ncclComm_t comm;
};

ncclResult_t lrAllReduce(const void* send, void* recv, size_t count, lowrankDataType_t dtype,
                         lowrankRedOp_t op, ncclComm_t comm, const char* what) {
#ifdef NCCL_DOUBLE_ON_STREAMS
  // NCCL's check of its buffers: device memory of the comm's device (or host memory here).
  for (const void* p : {send, const_cast<const void*>(recv)})
    if (const int dev = emu::pointerDevice(p); dev >= 0 && dev != comm->device)
      return fail(ncclInvalidArgument, "%s: buffer %p is memory of device %d, the communicator's "
                  "device is %d", what, p, dev, comm->device);
  // Emulated device memory would take lowrank to its device engine: reduce a host copy.
  std::vector<unsigned char> staged(static_cast<const unsigned char*>(send),
                                    static_cast<const unsigned char*>(send) + count * dtypeSize(ncclDataType_t(dtype)));
  lowrankResult_t r = lowrankAllReduce(staged.data(), staged.data(), count, dtype, op, comm->lr, nullptr);
  if (r == lowrankSuccess) std::memcpy(recv, staged.data(), staged.size());
#else
  lowrankResult_t r = lowrankAllReduce(send, recv, count, dtype, op, comm->lr, nullptr);
#endif
  ncclResult_t n;
  {
    std::lock_guard<std::mutex> lock(comm->abortMu);  // lr may be freed once aborting is set
    n = comm->aborting ? fail(ncclRemoteError, "%s: the communicator was aborted", what)
                       : fromLowrank(r, comm->lr, what);
  }
  if (r != lowrankSuccess && r != lowrankInvalidArgument && r != lowrankInvalidUsage) {
    int none = ncclSuccess;  // a broken collective: what ncclCommGetAsyncError reports
    comm->asyncError.compare_exchange_strong(none, n);
  }
  return n;
}

// Byte-wise max against zeros: the bytes one rank holds land unchanged on every rank.
ncclResult_t spreadBytes(void* buf, size_t bytes, ncclComm_t comm, const char* what) {
  if (bytes == 0) return ncclSuccess;
  return lrAllReduce(buf, buf, bytes, lowrankUint8, lowrankMax, comm, what);
}

// ---- premulsum -------------------------------------------------------------------------------

template <typename T>
void scaleAs(const void* src, const void* scalar, size_t count, void* dst) {
  T s;
  std::memcpy(&s, scalar, sizeof s);
  const T* x = static_cast<const T*>(src);
  T* y = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, half_t> || std::is_same_v<T, bf16_t>) {
      y[i] = lowrank::host::fromFloat<T>(lowrank::host::toFloat(x[i]) * lowrank::host::toFloat(s));
    } else if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;  // wraps as the device does, without signed overflow
      y[i] = T(U(U(x[i]) * U(s)));
    } else {
      y[i] = x[i] * s;
    }
  }
}

void scale(ncclDataType_t dtype, const void* src, const void* scalar, size_t count, void* dst) {
  switch (dtype) {
    case ncclInt8: scaleAs<int8_t>(src, scalar, count, dst); break;
    case ncclUint8: scaleAs<uint8_t>(src, scalar, count, dst); break;
    case ncclInt32: scaleAs<int32_t>(src, scalar, count, dst); break;
    case ncclUint32: scaleAs<uint32_t>(src, scalar, count, dst); break;
    case ncclInt64: scaleAs<int64_t>(src, scalar, count, dst); break;
    case ncclUint64: scaleAs<uint64_t>(src, scalar, count, dst); break;
    case ncclFloat16: scaleAs<half_t>(src, scalar, count, dst); break;
    case ncclFloat32: scaleAs<float>(src, scalar, count, dst); break;
    case ncclFloat64: scaleAs<double>(src, scalar, count, dst); break;
    case ncclBfloat16: scaleAs<bf16_t>(src, scalar, count, dst); break;
    default: break;  // checked by the caller
  }
}

ncclResult_t preMulSum(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                       ncclRedOp_t op, ncclComm_t comm) {
  unsigned char scalar[8];
  {
    std::lock_guard<std::mutex> lock(comm->opsMu);
    const size_t i = size_t(op) - ncclNumOps;
    if (i >= comm->preMul.size() || !comm->preMul[i].live)
      return fail(ncclInvalidArgument, "ncclAllReduce: unknown op %d", int(op));
    const ncclComm::PreMul& p = comm->preMul[i];
    if (p.dtype != dtype)
      return fail(ncclInvalidArgument, "ncclAllReduce: op %d was made for datatype %d, not %d",
                  int(op), int(p.dtype), int(dtype));
    std::memcpy(scalar, p.residence == ncclScalarDevice ? p.ptr : p.value, dtypeSize(dtype));
  }
  std::vector<unsigned char> scaled(count * dtypeSize(dtype));
  scale(dtype, send, scalar, count, scaled.data());
  return lrAllReduce(scaled.data(), recv, count, lowrankDataType_t(dtype), lowrankSum, comm,
                     "ncclAllReduce (premulsum)");
}

}  // namespace

ncclResult_t redOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclRedOpCreatePreMulSum")) return r;
  if (!op || !scalar)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: %s is NULL", op ? "scalar" : "op");
  if (ncclResult_t r = checkDtype(dtype, "ncclRedOpCreatePreMulSum")) return r;
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: unknown residence %d", int(residence));
  ncclComm::PreMul p;
  p.live = true;
  p.dtype = dtype;
  p.residence = residence;
  p.ptr = scalar;  // host memory here, so a "device" scalar is read through it at every call
  std::memcpy(p.value, scalar, dtypeSize(dtype));
  std::lock_guard<std::mutex> lock(comm->opsMu);
  size_t i = 0;
  while (i < comm->preMul.size() && comm->preMul[i].live) ++i;
  if (i == comm->preMul.size()) comm->preMul.push_back(p);
  else comm->preMul[i] = p;
  *op = ncclRedOp_t(ncclNumOps + int(i));
  return ncclSuccess;
}

ncclResult_t redOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclRedOpDestroy")) return r;
  std::lock_guard<std::mutex> lock(comm->opsMu);
  const size_t i = size_t(op) - ncclNumOps;
  if (int(op) < ncclNumOps || i >= comm->preMul.size() || !comm->preMul[i].live)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: op %d was not made by ncclRedOpCreatePreMulSum",
                int(op));
  comm->preMul[i].live = false;
  return ncclSuccess;
}

ncclResult_t allReduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                       ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclAllReduce")) return r;
  InFlight guard(comm);
  if (ncclResult_t r = checkDtype(dtype, "ncclAllReduce")) return r;
  if (int(op) < 0) return fail(ncclInvalidArgument, "ncclAllReduce: unknown op %d", int(op));
  if (count == 0) return ncclSuccess;  // NCCL accepts it; lowrank refuses count 0
  if (!send || !recv)
    return fail(ncclInvalidArgument, "ncclAllReduce: %s is NULL", send ? "recvbuff" : "sendbuff");
  if (int(op) >= ncclNumOps) return preMulSum(send, recv, count, dtype, op, comm);
  return lrAllReduce(send, recv, count, lowrankDataType_t(dtype), lowrankRedOp_t(op), comm,
                     "ncclAllReduce");
}

ncclResult_t broadcast(const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
                       ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclBroadcast")) return r;
  InFlight guard(comm);
  if (ncclResult_t r = checkDtype(dtype, "ncclBroadcast")) return r;
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclBroadcast: root %d is not in [0, %d)", root, comm->nranks);
  size_t bytes = 0;
  if (ncclResult_t r = byteCount(count, dtype, 1, "ncclBroadcast", &bytes)) return r;
  if (bytes && (!recv || (comm->rank == root && !send)))
    return fail(ncclInvalidArgument, "ncclBroadcast: %s is NULL", recv ? "sendbuff" : "recvbuff");
  if (comm->rank == root) std::memmove(recv, send, bytes);
  else if (bytes) std::memset(recv, 0, bytes);
  return spreadBytes(recv, bytes, comm, "ncclBroadcast");
}

ncclResult_t allGather(const void* send, void* recv, size_t sendcount, ncclDataType_t dtype,
                       ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclAllGather")) return r;
  InFlight guard(comm);
  if (ncclResult_t r = checkDtype(dtype, "ncclAllGather")) return r;
  size_t block = 0, total = 0;
  if (ncclResult_t r = byteCount(sendcount, dtype, 1, "ncclAllGather", &block)) return r;
  if (ncclResult_t r = byteCount(sendcount, dtype, size_t(comm->nranks), "ncclAllGather", &total)) return r;
  if (block && (!send || !recv))
    return fail(ncclInvalidArgument, "ncclAllGather: %s is NULL", send ? "recvbuff" : "sendbuff");
  if (!block) return ncclSuccess;
  unsigned char* out = static_cast<unsigned char*>(recv);
  const size_t mine = size_t(comm->rank) * block;
  std::memmove(out + mine, send, block);  // in place: send is already there
  std::memset(out, 0, mine);
  std::memset(out + mine + block, 0, total - mine - block);
  return spreadBytes(out, total, comm, "ncclAllGather");
}

ncclResult_t reduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t dtype,
                           ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclReduceScatter")) return r;
  InFlight guard(comm);
  if (ncclResult_t r = checkDtype(dtype, "ncclReduceScatter")) return r;
  size_t block = 0, total = 0;
  if (ncclResult_t r = byteCount(recvcount, dtype, 1, "ncclReduceScatter", &block)) return r;
  if (ncclResult_t r = byteCount(recvcount, dtype, size_t(comm->nranks), "ncclReduceScatter", &total))
    return r;
  if (block && !recv) return fail(ncclInvalidArgument, "ncclReduceScatter: recvbuff is NULL");
  std::vector<unsigned char> all(total);
  ncclResult_t r = allReduce(send, all.data(), recvcount * size_t(comm->nranks), dtype, op, comm);
  if (r == ncclSuccess && block) std::memcpy(recv, all.data() + size_t(comm->rank) * block, block);
  return r;
}

ncclResult_t reduce(const void* send, void* recv, size_t count, ncclDataType_t dtype, ncclRedOp_t op,
                    int root, ncclComm_t comm) {
  if (ncclResult_t r = checkComm(comm, "ncclReduce")) return r;
  InFlight guard(comm);
  if (ncclResult_t r = checkDtype(dtype, "ncclReduce")) return r;
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclReduce: root %d is not in [0, %d)", root, comm->nranks);
  size_t bytes = 0;
  if (ncclResult_t r = byteCount(count, dtype, 1, "ncclReduce", &bytes)) return r;
  if (bytes && comm->rank == root && !recv) return fail(ncclInvalidArgument, "ncclReduce: recvbuff is NULL");
  std::vector<unsigned char> all(bytes);
  ncclResult_t r = allReduce(send, all.data(), count, dtype, op, comm);
  if (r == ncclSuccess && comm->rank == root && bytes) std::memcpy(recv, all.data(), bytes);
  return r;
}

}  // namespace nccl_double
