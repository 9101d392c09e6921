// Helpers of the transport tests: comm ranks as threads, typed test data and a naive reference
// reduction.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"

namespace lowrank::test {

// Runs fn(rank) on n threads and joins them.
void runRanks(int n, const std::function<void(int)>& fn);

// Makes a unique id on this thread and creates n transports, one per thread. Fails the test (and
// returns an empty vector) if any creation fails.
std::vector<std::unique_ptr<Transport>> makeGroup(int n, double timeoutSec,
                                                  const UcxTransportOptions& opt = {});
// The same with each comm rank's own options (e.g. its own tuning timer).
std::vector<std::unique_ptr<Transport>> makeGroup(
    int n, double timeoutSec, const std::function<UcxTransportOptions(int rank)>& optionsOf);

// Allreduce on every transport of the group at once (one thread each); returns each rank's status.
std::vector<Status> allreduceAll(std::vector<std::unique_ptr<Transport>>& group,
                                 std::vector<std::vector<uint8_t>>& bufs, size_t count,
                                 lowrankDataType_t dtype, lowrankRedOp_t op);

// Test data whose reductions are exact in every dtype (so that any algorithm must match the
// reference bit for bit): multiples of 1/4 in [-2, 2] for floats (powers of two for prod), small
// integers for the integer types.
std::vector<uint8_t> exactData(lowrankDataType_t dtype, lowrankRedOp_t op, int rank, size_t count,
                               uint32_t seed);

// The naive reduction of the ranks' inputs, element by element in comm-rank order.
std::vector<uint8_t> referenceReduce(const std::vector<std::vector<uint8_t>>& inputs, size_t count,
                                     lowrankDataType_t dtype, lowrankRedOp_t op);

// Index of the first element where a and b differ bitwise, or -1.
long firstDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t elemSize);

uint64_t elementsSent(const std::vector<std::unique_ptr<Transport>>& group);

// One allreduce (sum) of exactData float32 on every rank of the group at once, checked on every
// rank bit for bit against referenceReduce (gtest assertions; returns at the first failure).
void checkExactFloatSum(std::vector<std::unique_ptr<Transport>>& group, size_t count, uint32_t seed);

}  // namespace lowrank::test
