/* A program linked with the real -lnccl that only asks the version and an error string: with
 * LD_PRELOAD=liblowrank_nccl.so (and LD_BIND_NOW=1) it shows that the real library loads behind
 * the shim with no unresolved symbol, and through the drop-in that the forwarders reach it.
 * Prints "version N bound-allreduce-is-real R"; R is 0 when ncclAllReduce is interposed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  if (r != ncclSuccess) {
    fprintf(stderr, "ncclGetVersion: %d\n", (int)r);
    return 1;
  }
  const char* s = ncclGetErrorString(ncclInvalidUsage);
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  void* real = h ? dlsym(h, "pncclAllReduce") : NULL;
  printf("version %d bound-allreduce-is-real %d error-string %s\n", v,
         real != NULL && (void*)&ncclAllReduce == real, s ? s : "(null)");
  return 0;
}
