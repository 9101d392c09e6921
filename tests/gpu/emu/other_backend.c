/* A CUDA backend of another build, for test_backend_loader: built as the last backend of the C++
 * table (OTHER_VERSION 2: `lowrankCudaBackend`, its ABI number first) and as plain-C tables of other
 * versions (OTHER_VERSION n: `lowrankCudaBackendV<n>`, older and newer than this tree's).
 * liblowrank must refuse each, naming both versions. */
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
#define TABLE_NAME(v) TABLE_NAME_(v)
#define TABLE_NAME_(v) lowrankCudaBackendV##v

#if OTHER_VERSION == 2
EXPORT const struct { int abi; void* createEngine; void* streamCapturing; } lowrankCudaBackend = {
    2, NULL, NULL};
#else
EXPORT const struct { uint32_t version, size; void* entries[16]; } TABLE_NAME(OTHER_VERSION) = {
    OTHER_VERSION, sizeof(TABLE_NAME(OTHER_VERSION)), {NULL}};
#endif
