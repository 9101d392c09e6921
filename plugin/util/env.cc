#include "util/env.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <strings.h>

namespace lowrank::env {
namespace {

Status bad(const char* name, const char* value, const char* want) {
  return Status::Error(lowrankInvalidUsage, "environment variable %s=\"%s\" is not %s", name, value,
                       want);
}

// Each row: name, docs/environment.md's table (comm, launchers, nccl, shim, python), values,
// default, meaning.
constexpr Variable kTable[] = {
    // Read when a communicator is created (plugin/api/config.cc), logging, the bootstrap, the
    // CUDA backend.
    {"LOWRANK_APPROX_RANK", "comm", "integer 0 .. 65536", "4",
     "approximation rank k; 0 turns compression off (exact allreduce)"},
    {"LOWRANK_MIN_COMPRESSION_RATE", "comm", "number >= 1", "2",
     "a tensor is compressed only if (n + m) k rate < n m"},
    {"LOWRANK_START_ITER", "comm", "integer 0 .. 2^30", "0",
     "calls per buffer done exactly before compression starts (under the NCCL shim too, counted "
     "from the buffer's first call the shim gives lowrank: "
     "[nccl_shim.md](nccl_shim.md#what-is-compressed-and-when))"},
    {"LOWRANK_ERROR_FEEDBACK", "comm", "0/1, true/false, yes/no, on/off", "1",
     "keep the residual and add it at the next call"},
    {"LOWRANK_WARM_START", "comm", "same", "1",
     "start power iteration from the last call's Q"},
    {"LOWRANK_ORTHO_EPSILON", "comm", "number >= 0", "0",
     "added to column norms in Gram-Schmidt (k <= 2), as PyTorch's `orthogonalization_epsilon`"},
    {"LOWRANK_SEED", "comm", "decimal integer in [0, 2^63 - 1]", "0",
     "seed of the initial Q (must be the same on every rank)"},
    {"LOWRANK_TIMEOUT", "comm", "seconds > 0", "300",
     "bound on every wait for a peer (bootstrap and collectives)"},
    {"LOWRANK_PIPELINE", "comm", "0/1, true/false, yes/no, on/off", "1",
     "overlap the factor allreduces with the compression passes, chunk by chunk (a progress thread"
     " per communicator drives the transport); 0 runs the phases one after another"},
    {"LOWRANK_ALTERNATE", "comm", "0/1, true/false, yes/no, on/off", "0",
     "alternating PowerSGD (ACP-SGD): one factor allreduce per call, P and Q on alternate calls; "
     "needs LOWRANK_WARM_START=1. Must be the same on every rank"},
    {"LOWRANK_FACTOR_DTYPE", "comm", "fp32, bf16, fp16 (or float32, bfloat16, float16)", "fp32",
     "the dtype PowerSGD's factors travel in: bf16 or fp16 halve the factors' bytes (host: each"
     " send rounds once, sums in float32; fp16 spans 6e-5 to 65504: a call whose inputs could"
     " overflow it goes exact, small factors lose bits, so prefer bf16; device: NCCL sums bfloat16,"
     " fp16 included). The PyTorch hooks' factor_dtype wins over it. Must be the same on every"
     " rank"},
    {"LOWRANK_HOST_ISA", "comm", "`auto`, `avx2`, `baseline` (any case)", "`auto`",
     "the instruction set of the host kernels' element-wise passes (pass 2, pass 3, the residuals, "
     "the alternating steps' first sweeps, the P step's dot products in 8 fixed lanes): "
     "`auto` takes AVX2 where the CPU has it (x86-64 builds by GCC), `baseline` the x86-64 "
     "baseline (SSE2). Every result bit is the same with either, only time differs; PowerSGD's "
     "pass 1 always runs the baseline. `avx2` on a CPU without it fails lowrankCommInitRank. Read once per "
     "process, at the first compressed call"},
    {"LOWRANK_PIPELINE_CHUNK", "comm", "integer 1 .. 2^30", "8388608",
     "elements of the gradient matrix per chunk; buffers with fewer than two chunks of compressed "
     "elements are not chunked. Must be the same on every rank"},
    {"LOWRANK_UCX_PROBE", "comm", "boolean", "1",
     "measure the links when a communicator is made (pairs of comm ranks time a small ping-pong, a"
     " burst of small messages and two large messages; every comm rank takes the max over ranks of"
     " each constant, so all choose alike; about 0.1 s at 100 Mbit/s and 1 ms) and let the host "
     "transport's cost model choose with α, o and β measured, except those pinned below; logged at"
     " `INFO`, given by `lowrankCommGetTransportInfo`. Only where the model chooses (not with a "
     "forced algorithm nor `tune`). 0: the constants below or their defaults, nothing measured, so"
     " the choice never depends on timing (the test suite and `studies/ab/compare_outputs.sh` set "
     "0; the perf binary's thread mode too). Must be the same on every rank"},
    {"LOWRANK_UCX_ALPHA_US", "comm", "number > 0", "measured, else 5",
     "the host transport's cost model: microseconds per step (α), "
     "[benchmarks.md](benchmarks.md#4-choosing-the-host-allreduce-algorithm); set: pinned (not "
     "measured). Must be the same on every rank"},
    {"LOWRANK_UCX_BETA_NS", "comm", "number > 0", "measured, else 0.08 (100 Gbit/s)",
     "the same model: nanoseconds per byte sent (β); set: pinned. Must be the same on every rank"},
    {"LOWRANK_UCX_OVERHEAD_US", "comm", "number >= 0", "measured, else 0",
     "the same model: microseconds per message a step handles beyond one send and one receive "
     "(LogP's o; direct handles 2(N-2) more); set: pinned. Must be the same on every rank"},
    {"LOWRANK_UCX_ALGO", "comm",
     "`auto`, `ring`, `halving_doubling`, `recursive_doubling`, `direct`, `tune` (any case)",
     "`auto`",
     "the host allreduce algorithm: `auto` lets the cost model choose per call (logged at "
     "`TRACE`); a name runs that one for every call (for benchmarks); `tune` (opt-in) times every "
     "candidate on the first calls of each size class, agrees on the timings across the comm ranks"
     " and freezes the fastest (logged at `INFO`; its cost: "
     "[benchmarks.md](benchmarks.md#4-choosing-the-host-allreduce-algorithm)). Must be the same on"
     " every rank"},
    {"LOWRANK_SOCKET_IFNAME", "comm",
     "interface name", "first non-loopback interface that is up, else `lo`",
     "where the bootstrap root listens"},
    {"LOWRANK_DEBUG", "comm", "`WARN`, `INFO`, `TRACE`, `VERSION`, `NONE`", "none",
     "`VERSION` prints the version once per process (so do the levels); logging, in NCCL's form "
     "`host:pid:tid [dev] LOWRANK INFO ...` (`[dev]` where a CUDA device is known)"},
    {"LOWRANK_DEBUG_FILE", "comm", "path; `%h` host, `%p` pid", "stderr",
     "where logging goes"},
    {"LOWRANK_CUDA_BACKEND", "comm",
     "path",
     "`liblowrank_cuda.so` beside `liblowrank.so`; the Python package sets it, when unset, to its "
     "build's backend where that is not beside the library (an in-tree or editable build)",
     "the CUDA backend, loaded the first time a device buffer appears ([cuda.md](cuda.md))"},
    {"LOWRANK_TEST_FAIL_ALLOC", "comm", "comm rank >= -1", "-1 (none)",
     "for tests: that comm rank fails to allocate every buffer's state at plan time; every rank "
     "then allreduces that buffer exactly (the collective fallback)"},
    {"LOWRANK_RANK", "launchers", "integer in [0, `LOWRANK_WORLD_SIZE`)",
     "torchrun's `RANK`, Open MPI's `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, Slurm's `SLURM_PROCID` "
     "(the first pair set wins)",
     "comm rank; set with `LOWRANK_WORLD_SIZE` or not at all"},
    {"LOWRANK_WORLD_SIZE", "launchers", "integer >= 1",
     "the pair's `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`", "comm size"},
    {"LOWRANK_ROOT_ADDR", "launchers", "`host:port`", "`MASTER_ADDR` with port `MASTER_PORT + 1`",
     "where comm rank 0 serves the bootstrap"},
    {"LOWRANK_SECRET", "launchers", "32 hex digits",
     "a secret derived from the root address and world size",
     "the bootstrap's secret, the same on every rank"},
    // The launchers' own variables, read in their place (transport/bootstrap/launcher_env.cc).
    {"RANK"}, {"WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK"}, {"OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK"},
    {"PMI_SIZE"}, {"SLURM_PROCID"}, {"SLURM_NTASKS"}, {"MASTER_ADDR"}, {"MASTER_PORT"},
    {"UCX_RNDV_THRESH"},  // UCX's own; set, it keeps UCX's threshold (transport/ucx/eager.h)
    {"LOWRANK_NCCL_LIBRARY", "nccl",
     "path or soname", "`libnccl.so.2` (the one the program already loaded)",
     "the real NCCL that lowrank's own NCCL calls go to, opened once per process; each entry point"
     " is its `pnccl*` name where exported. A library that cannot be opened, or lacks a symbol, "
     "makes `lowrankCommInitFromNccl` fail with `lowrankSystemError` naming it"},
    {"LOWRANK_NCCL_WHEEL_PATH", "nccl",
     "folders, `:`-separated", "set by the Python package to `sys.path` when unset",
     "where NVIDIA's NCCL wheel (`nvidia/nccl/lib/libnccl.so.2`) is looked for, after an NCCL the "
     "process has loaded and before `libnccl.so.2` from the dynamic loader (docs/pytorch.md, "
     "Install); empty: not looked for"},
    {"LOWRANK_CUSOLVER_LIBRARY", "nccl",
     "path or soname", "`libcusolver.so.12`, else `libcusolver.so`",
     "the cuSOLVER whose QR orthonormalizes device factors with approximation rank > 32, opened "
     "once per process when a plan first needs it. One that cannot be opened, or lacks the QR "
     "entry points, is not an error: those factors are orthonormalized by lowrank's one-block "
     "kernel, and a warning names the reason"},
    {"LOWRANK_ENABLE", "shim", "0/1, true/false, yes/no, on/off", "1",
     "0: the shim passes every call through to the real NCCL and makes nothing"},
    {"LOWRANK_MIN_BYTES", "shim", "integer >= 0 (bytes)", "1048576",
     "an allreduce smaller than this (count x element size) is never compressed"},
    // The same variable in the shim's table, as the shim sees it.
    {"LOWRANK_NCCL_LIBRARY", "shim",
     "path", "drop-in: none, required; `LD_PRELOAD`: the `libnccl.so.2` the program loaded",
     "the real NCCL behind the shim (see the NCCL table above); leave it unset with `LD_PRELOAD`"},
    // Read by the Python package only (python/lowrank/_capi.py).
    {"LOWRANK_LIBRARY", "python",
     "path to `liblowrank.so`, or its folder",
     "the package's own `lowrank/lib/liblowrank.so`, then a `meson install`, a checkout's "
     "`build*/`, the dynamic loader",
     "the liblowrank the Python package loads ([pytorch.md](pytorch.md#install)); when set, "
     "nothing else is tried. It does not apply to the perf binary or the shim, which find the "
     "liblowrank of their own install through `$ORIGIN`"},
};

}  // namespace

std::span<const Variable> table() { return kTable; }

const char* get(const char* name) {
  for (const Variable& v : kTable)
    if (!strcmp(v.name, name)) {
      const char* value = getenv(name);
      return value && *value ? value : nullptr;
    }
  fprintf(stderr, "lowrank: %s is read but not in plugin/util/env.cc's table; aborting\n", name);
  abort();
}

Status integer(const char* name, long lo, long hi, int* out) {
  const char* v = get(name);
  if (!v) return Status::Ok();
  char* end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    char want[96];
    snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
    return bad(name, v, want);
  }
  *out = int(x);
  return Status::Ok();
}

Status number(const char* name, double lo, bool loOpen, double* out) {
  const char* v = get(name);
  if (!v) return Status::Ok();
  char* end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || *end || !std::isfinite(x) || x < lo || (loOpen && x == lo)) {
    char want[96];
    snprintf(want, sizeof want, "a number %s %g", loOpen ? ">" : ">=", lo);
    return bad(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status boolean(const char* name, bool* out) {
  const char* v = get(name);
  if (!v) return Status::Ok();
  if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
    *out = true;
  else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
    *out = false;
  else
    return bad(name, v, "a boolean (0/1, true/false, yes/no, on/off)");
  return Status::Ok();
}

Status choice(const char* name, const char* const* names, int count, int* out) {
  const char* v = get(name);
  if (!v) return Status::Ok();
  for (int i = 0; i < count; ++i)
    if (!strcasecmp(v, names[i])) {
      *out = i;
      return Status::Ok();
    }
  std::string want = "one of";
  for (int i = 0; i < count; ++i) (want += i ? ", " : " ") += names[i];
  return bad(name, v, want.c_str());
}

Status unsignedInteger(const char* name, uint64_t* out, unsigned long long max) {
  const char* v = get(name);
  if (!v) return Status::Ok();
  char* end;
  errno = 0;
  // Decimal digits only: strtoull alone would take " -1" as 2^64 - 1 and "010" as octal.
  const bool digits = v[strspn(v, "0123456789")] == 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!digits || errno || *end || x > max) {
    char want[96];
    snprintf(want, sizeof want, "a decimal integer in [0, %llu]", max);
    return bad(name, v, want);
  }
  *out = x;
  return Status::Ok();
}

Status checkDebug() {
  const char* v = get("LOWRANK_DEBUG");
  if (!v) return Status::Ok();
  for (const char* ok : {"NONE", "VERSION", "WARN", "INFO", "TRACE"})
    if (!strcasecmp(v, ok)) return Status::Ok();
  return bad("LOWRANK_DEBUG", v, "one of WARN, INFO, TRACE, VERSION, NONE");
}

Status shimEnv(ShimEnv* out) {
  ShimEnv e;
  LR_RETURN_IF_ERROR(boolean("LOWRANK_ENABLE", &e.enable));
  if (!e.enable) {  // the kill switch: nothing else is read, so nothing else can fail
    *out = e;
    return Status::Ok();
  }
  LR_RETURN_IF_ERROR(checkDebug());
  LR_RETURN_IF_ERROR(unsignedInteger("LOWRANK_MIN_BYTES", &e.minBytes));  // any non-negative integer
  *out = e;
  return Status::Ok();
}

}  // namespace lowrank::env
