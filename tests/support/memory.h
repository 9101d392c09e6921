// Resident memory of this process, as the kernel counts it (/proc/self/statm).
#pragma once
#include <malloc.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>

namespace lowrank::testing {

// Resident set size in bytes; 0 if /proc is not readable.
inline size_t residentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

// Resident bytes once glibc has returned its free heap pages: what a leak would still hold, and
// not what the allocator merely keeps cached for reuse (its mmap threshold rises after large
// frees).
inline size_t residentBytesTrimmed() {
  malloc_trim(0);
  return residentBytes();
}

}  // namespace lowrank::testing
