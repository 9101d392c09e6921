/* A CUDA backend of another build, for test_backend_loader: built twice, as the last backend of
 * the C++ table (OTHER_VERSION 2: `lowrankCudaBackend`, its ABI number first) and as a newer one
 * (OTHER_VERSION 4: `lowrankCudaBackendV4`). liblowrank must refuse either, naming both versions. */
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

#if OTHER_VERSION == 2
EXPORT const struct { int abi; void* createEngine; void* streamCapturing; } lowrankCudaBackend = {
    2, NULL, NULL};
#else
EXPORT const struct { uint32_t version, size; void* entries[16]; } lowrankCudaBackendV4 = {
    OTHER_VERSION, sizeof(lowrankCudaBackendV4), {NULL}};
#endif
