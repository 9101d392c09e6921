#include "util/dtype.h"

namespace lowrank {

const char* dtypeName(lowrankDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64",
                                "uint64", "half", "float", "double", "bfloat16"};
  return (t >= 0 && t < lowrankNumTypes) ? names[t] : "unknown";
}

const char* opName(lowrankRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (op >= 0 && op < lowrankNumOps) ? names[op] : "unknown";
}

}  // namespace lowrank
