// Element types of the perf binary: names (nccl-tests spelling), sizes, and conversions to and from
// double / float, float16 and bfloat16 included (small helpers; no library internals).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lowrank/lowrank.h"

namespace perf {

// nccl-tests' name of a type ("float", "half", "bfloat16", "int32", ...).
const char* typeName(lowrankDataType_t t);
// Accepts nccl-tests' names and aliases (float32, fp16, bf16, int, char, ...). nullopt if unknown.
std::optional<lowrankDataType_t> parseType(const std::string& s);
std::vector<lowrankDataType_t> allTypes();
size_t typeSize(lowrankDataType_t t);
bool isFloating(lowrankDataType_t t);
bool isSigned(lowrankDataType_t t);

const char* opName(lowrankRedOp_t op);
std::optional<lowrankRedOp_t> parseOp(const std::string& s);
std::vector<lowrankRedOp_t> allOps();

// IEEE binary16 and bfloat16, round to nearest even; NaN stays NaN, overflow becomes Inf.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

// Element i of a typed buffer as a double, and a double stored into a typed buffer (rounded to
// nearest for floating types, to nearest integer, saturated, for integer types).
double loadAsDouble(const void* buf, lowrankDataType_t t, size_t i);
void storeFromDouble(void* buf, lowrankDataType_t t, size_t i, double v);

// Bulk conversions.
void toDouble(const void* src, lowrankDataType_t t, size_t n, double* dst);
void fromFloat(const float* src, size_t n, lowrankDataType_t t, void* dst);
void floatToHalfN(const float* src, uint16_t* dst, size_t n);
void halfToFloatN(const uint16_t* src, float* dst, size_t n);

}  // namespace perf
