// The one test-only entry point of the NCCL test double (libnccl.so.2 in this directory), beside
// NCCL's own API. Tests use it to see which entry points were really called, e.g. that lowrank's
// NCCL transport goes through pncclAllReduce and never the interposable ncclAllReduce.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Calls made in this process to the exported entry point `entry` ("ncclAllReduce",
// "pncclAllReduce", "ncclGroupStart", ...): the plain and p-prefixed names count apart. 0 for a
// name the double does not export or never saw called.
unsigned long long ncclDoubleCallCount(const char* entry);

#ifdef __cplusplus
}
#endif
