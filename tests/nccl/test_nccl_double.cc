// The NCCL test double itself (tests/support/nccl_double): its collectives give what NCCL defines,
// bit for bit where NCCL moves data without arithmetic, and bad input gets NCCL's error codes.
// Comm ranks are threads; the double is linked as libnccl.so.2.
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "util/convert.h"
#include "nccl_double.h"
#include "nccl_ranks.h"

namespace {

using ncclranks::withNcclComms;
namespace hc = lowrank::host;

size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

bool isSigned(ncclDataType_t t) { return t != ncclUint8 && t != ncclUint32 && t != ncclUint64; }
bool isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

template <typename T>
void put(void* p, size_t i, T v) { std::memcpy(static_cast<char*>(p) + i * sizeof v, &v, sizeof v); }
template <typename T>
T get(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof v, sizeof v);
  return v;
}

// Stores v (exactly representable in every type used here) as element i of type t.
void store(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclInt8: put<int8_t>(p, i, int8_t(v)); break;
    case ncclUint8: put<uint8_t>(p, i, uint8_t(v)); break;
    case ncclInt32: put<int32_t>(p, i, int32_t(v)); break;
    case ncclUint32: put<uint32_t>(p, i, uint32_t(v)); break;
    case ncclInt64: put<int64_t>(p, i, int64_t(v)); break;
    case ncclUint64: put<uint64_t>(p, i, uint64_t(v)); break;
    case ncclFloat16: put<hc::half_t>(p, i, hc::toHalf(float(v))); break;
    case ncclFloat32: put<float>(p, i, float(v)); break;
    case ncclFloat64: put<double>(p, i, v); break;
    case ncclBfloat16: put<hc::bf16_t>(p, i, hc::toBf16(float(v))); break;
    default: FAIL() << "dtype " << t;
  }
}

double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return get<int8_t>(p, i);
    case ncclUint8: return get<uint8_t>(p, i);
    case ncclInt32: return get<int32_t>(p, i);
    case ncclUint32: return get<uint32_t>(p, i);
    case ncclInt64: return double(get<int64_t>(p, i));
    case ncclUint64: return double(get<uint64_t>(p, i));
    case ncclFloat16: return hc::toFloat(get<hc::half_t>(p, i));
    case ncclFloat32: return get<float>(p, i);
    case ncclFloat64: return get<double>(p, i);
    case ncclBfloat16: return hc::toFloat(get<hc::bf16_t>(p, i));
    default: return NAN;
  }
}

// Small integers, negative for signed types, so that sums and products of 3 ranks are exact.
double value(ncclDataType_t t, int rank, size_t i) {
  const double v = double((i * 7 + size_t(rank) * 3) % 5);
  return isSigned(t) ? v - 2 : v + 1;
}

// What NCCL gives for op over the values of n comm ranks (avg: integers truncate toward zero,
// floats divide in float32 (float64 for double) and round once to the type).
double expected(ncclDataType_t t, ncclRedOp_t op, int n, size_t i) {
  double acc = value(t, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = value(t, r, i);
    acc = op == ncclProd ? acc * v : op == ncclMax ? std::max(acc, v) : op == ncclMin ? std::min(acc, v) : acc + v;
  }
  if (op != ncclAvg) return acc;
  if (!isFloat(t)) return std::trunc(acc / n);
  if (t == ncclFloat64) return acc / n;
  const float f = float(acc) / float(n);
  if (t == ncclFloat16) return hc::toFloat(hc::toHalf(f));
  if (t == ncclBfloat16) return hc::toFloat(hc::toBf16(f));
  return f;
}

const char* opName(ncclRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return names[op];
}

TEST(NcclDouble, VersionIsTheHeadersAndErrorsHaveStrings) {
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("version is NULL"), std::string::npos);
  for (int r = 0; r < ncclNumResults; ++r) EXPECT_STRNE(ncclGetErrorString(ncclResult_t(r)), "");
}

TEST(NcclDouble, AllReduceEveryDtypeAndOp) {
  const int n = 3;
  const size_t count = 1000;
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    for (int t = 0; t <= int(ncclBfloat16); ++t) {
      const auto dt = ncclDataType_t(t);
      for (int o = 0; o < int(ncclNumOps); ++o) {
        const auto op = ncclRedOp_t(o);
        std::vector<char> send(count * sizeOf(dt)), recv(send.size());
        for (size_t i = 0; i < count; ++i) store(dt, send.data(), i, value(dt, rank, i));
        const bool inPlace = (t + o) % 2 == 0;
        if (inPlace) recv = send;
        ASSERT_EQ(ncclAllReduce(inPlace ? recv.data() : send.data(), recv.data(), count, dt, op,
                                comm, nullptr), ncclSuccess) << ncclGetLastError(comm);
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += load(dt, recv.data(), i) != expected(dt, op, n, i);
        EXPECT_EQ(wrong, 0u) << "dtype " << t << " op " << opName(op) << (inPlace ? " in place" : "");
      }
    }
  });
}

TEST(NcclDouble, ApproxRankInTheEnvironmentNeverCompresses) {
  // With compression a 64 x 64 float32 matrix of rank > 4 would come back approximated.
  setenv("LOWRANK_APPROX_RANK", "2", 1);
  const size_t count = 64 * 64;
  withNcclComms(2, [&](int rank, ncclComm_t comm) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = float((i * 31 + size_t(rank) * 7) % 97);
    for (int call = 0; call < 2; ++call) {
      std::vector<float> y = x;
      ASSERT_EQ(ncclAllReduce(y.data(), y.data(), count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i)
        wrong += y[i] != float((i * 31) % 97 + (i * 31 + 7) % 97);
      EXPECT_EQ(wrong, 0u) << "call " << call;
    }
  });
  unsetenv("LOWRANK_APPROX_RANK");
}

TEST(NcclDouble, BroadcastMovesEveryBit) {
  const int n = 3, root = 1;
  // -0.0 and a NaN with a payload: an arithmetic broadcast would lose them.
  const uint32_t bits[] = {0x80000000u, 0x7fc01234u, 0x3f800001u, 0xff800000u, 0x00000001u};
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    std::vector<uint32_t> send(5, 0xdeadbeefu), recv(5, 0xdeadbeefu), inplace(5, 0xdeadbeefu);
    if (rank == root) {
      std::memcpy(send.data(), bits, sizeof bits);
      inplace = send;
    }
    ASSERT_EQ(ncclBroadcast(send.data(), recv.data(), 5, ncclFloat32, root, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclBcast(inplace.data(), 5, ncclFloat32, root, comm, nullptr), ncclSuccess);
    EXPECT_EQ(std::memcmp(recv.data(), bits, sizeof bits), 0) << "comm rank " << rank;
    EXPECT_EQ(std::memcmp(inplace.data(), bits, sizeof bits), 0) << "comm rank " << rank;
    EXPECT_EQ(ncclBroadcast(send.data(), recv.data(), 5, ncclFloat32, n, comm, nullptr), ncclInvalidArgument);
  });
}

TEST(NcclDouble, AllGatherInPlaceAndNot) {
  const int n = 3;
  const size_t per = 7;
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    std::vector<int64_t> send(per), recv(per * n, -1), inplace(per * n, -1);
    for (size_t i = 0; i < per; ++i) send[i] = int64_t(rank) * 100 + int64_t(i) - 50;
    std::memcpy(inplace.data() + size_t(rank) * per, send.data(), per * 8);
    ASSERT_EQ(ncclAllGather(send.data(), recv.data(), per, ncclInt64, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllGather(inplace.data() + size_t(rank) * per, inplace.data(), per, ncclInt64, comm,
                            nullptr), ncclSuccess);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < per; ++i) {
        EXPECT_EQ(recv[size_t(r) * per + i], int64_t(r) * 100 + int64_t(i) - 50);
        EXPECT_EQ(inplace[size_t(r) * per + i], int64_t(r) * 100 + int64_t(i) - 50);
      }
  });
}

TEST(NcclDouble, ReduceScatterAndReduce) {
  const int n = 3, root = 2;
  const size_t per = 5;
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    std::vector<float> send(per * n), part(per, -1), all(per * n, -1);
    for (size_t i = 0; i < send.size(); ++i) send[i] = float(i + size_t(rank));
    ASSERT_EQ(ncclReduceScatter(send.data(), part.data(), per, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    for (size_t i = 0; i < per; ++i) EXPECT_EQ(part[i], float(3 * (size_t(rank) * per + i) + 3));
    ASSERT_EQ(ncclReduce(send.data(), all.data(), send.size(), ncclFloat32, ncclMax, root, comm, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < all.size(); ++i)
      EXPECT_EQ(all[i], rank == root ? float(i + 2) : -1.f) << "comm rank " << rank;  // root only
  });
}

TEST(NcclDouble, PreMulSumWithHostAndDeviceScalars) {
  const int n = 2;
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    double hostScalar = rank + 2.0, devScalar = 10.0;  // "device" memory is host memory here
    ncclRedOp_t hostOp, devOp;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&hostOp, &hostScalar, ncclFloat64, ncclScalarHostImmediate, comm),
              ncclSuccess);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&devOp, &devScalar, ncclFloat64, ncclScalarDevice, comm), ncclSuccess);
    EXPECT_NE(hostOp, devOp);
    EXPECT_GE(int(hostOp), int(ncclNumOps));
    hostScalar = 1000;  // immediate: the value at creation counts
    devScalar = rank + 3.0;  // device: read at the call
    std::vector<double> x = {1, 2, 3}, y(3);
    ASSERT_EQ(ncclAllReduce(x.data(), y.data(), 3, ncclFloat64, hostOp, comm, nullptr), ncclSuccess);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(y[i], x[i] * 2 + x[i] * 3);
    ASSERT_EQ(ncclAllReduce(x.data(), y.data(), 3, ncclFloat64, devOp, comm, nullptr), ncclSuccess);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(y[i], x[i] * 3 + x[i] * 4);
    // Another dtype than the op's, and ops destroyed, are refused.
    std::vector<float> f(3, 1.f);
    EXPECT_EQ(ncclAllReduce(f.data(), f.data(), 3, ncclFloat32, hostOp, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(hostOp, comm), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(hostOp, comm), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(x.data(), y.data(), 3, ncclFloat64, hostOp, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(devOp, comm), ncclSuccess);
  });
}

TEST(NcclDouble, PreMulSumInHalfRoundsOncePerStep) {
  withNcclComms(2, [&](int rank, ncclComm_t comm) {
    hc::half_t scalar = hc::toHalf(0.5f);
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat16, ncclScalarHostImmediate, comm), ncclSuccess);
    std::vector<hc::half_t> x(4), y(4);
    for (size_t i = 0; i < 4; ++i) x[i] = hc::toHalf(float(i + 1 + rank));
    ASSERT_EQ(ncclAllReduce(x.data(), y.data(), 4, ncclFloat16, op, comm, nullptr), ncclSuccess);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(hc::toFloat(y[i]), 0.5f * float(i + 1) + 0.5f * float(i + 2));
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
  });
}

TEST(NcclDouble, GroupsNestAndAnUnmatchedEndIsRefused) {
  withNcclComms(2, [&](int rank, ncclComm_t comm) {
    int x = rank + 1;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(x, 3);  // calls inside a group run at once
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("ncclGroupStart"), std::string::npos);
  });
}

TEST(NcclDouble, CommQueriesAndCountZero) {
  const int n = 3;
  withNcclComms(n, [&](int rank, ncclComm_t comm) {
    int v = -1;
    ASSERT_EQ(ncclCommCount(comm, &v), ncclSuccess);
    EXPECT_EQ(v, n);
    ASSERT_EQ(ncclCommUserRank(comm, &v), ncclSuccess);
    EXPECT_EQ(v, rank);
    ASSERT_EQ(ncclCommCuDevice(comm, &v), ncclSuccess);
    EXPECT_EQ(v, 0);
    ncclResult_t async = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  });
}

TEST(NcclDouble, BadArgumentsGetNcclErrors) {
  withNcclComms(1, [&](int, ncclComm_t comm) {
    float x[2] = {1, 2};
    EXPECT_EQ(ncclAllReduce(x, x, 2, ncclFloat8e4m3, ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("fp8"), std::string::npos);
    EXPECT_EQ(ncclAllReduce(x, x, 2, ncclDataType_t(77), ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclRedOp_t(9), comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(nullptr, x, 2, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("comm is NULL"), std::string::npos);
    EXPECT_EQ(ncclReduce(x, x, 2, ncclFloat32, ncclSum, -1, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCount(comm, nullptr), ncclInvalidArgument);
  });
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);  // as NCCL
  ncclComm_t two[2];
  EXPECT_EQ(ncclCommInitAll(two, 2, nullptr), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("one comm rank per thread"), std::string::npos);
}

TEST(NcclDouble, InitAllOfOneDeviceAndConfigInit) {
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  int n = 0;
  ASSERT_EQ(ncclCommCount(comm, &n), ncclSuccess);
  EXPECT_EQ(n, 1);
  double x = 4;
  ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat64, ncclAvg, comm, nullptr), ncclSuccess);
  EXPECT_EQ(x, 4);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);

  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(NcclDouble, AbortFromAnotherThreadEndsAWaitingCall) {
  setenv("LOWRANK_TIMEOUT", "60", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comms[2] = {nullptr, nullptr};
  {
    std::thread other([&] { EXPECT_EQ(ncclCommInitRank(&comms[1], 2, id, 1), ncclSuccess); });
    EXPECT_EQ(ncclCommInitRank(&comms[0], 2, id, 0), ncclSuccess);
    other.join();
  }
  unsetenv("LOWRANK_TIMEOUT");
  ASSERT_TRUE(comms[0] && comms[1]);
  // Comm rank 1 never joins the call: comm rank 0 waits until its comm is aborted.
  std::vector<float> x(1000, 1.f);
  ncclResult_t r = ncclSuccess;
  std::thread waiting([&] { r = ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat32, ncclSum, comms[0], nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  waiting.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r, ncclRemoteError);
  EXPECT_LT(waited, 10.0) << "the call should end soon after the abort, not at the 60 s timeout";
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

TEST(NcclDouble, CountsEachEntryPointApart) {
  withNcclComms(1, [&](int, ncclComm_t comm) {
    const unsigned long long plain = ncclDoubleCallCount("ncclAllReduce");
    const unsigned long long p = ncclDoubleCallCount("pncclAllReduce");
    int x = 1;
    ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(pncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(pncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclDoubleCallCount("ncclAllReduce"), plain + 1);
    EXPECT_EQ(ncclDoubleCallCount("pncclAllReduce"), p + 2);
    EXPECT_EQ(ncclDoubleCallCount("ncclNoSuchThing"), 0u);
    EXPECT_EQ(ncclDoubleCallCount(nullptr), 0u);
  });
}

}  // namespace
