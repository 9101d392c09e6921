#!/usr/bin/env bash
# The device checks of the CUDA backend and the NCCL shim, for a machine with a GPU (they cannot
# run on the CPU machines where CI runs). Brings what it needs: a build made by
# tests/gpu/pack_for_device.sh (build-device/, with UCX's libraries in build-device/device-libs),
# carried to the GPU machine; NCCL and CUDA come from that machine (PyTorch's NCCL wheel).
#   tests/gpu/run_device_checks.sh [BUILD_DIR]       (default build-device)
#   tests/gpu/run_device_checks.sh --emulation [BUILD_DIR]
#     the device tests (kernels, engine, two ranks, schedule mutants) on the CPU emulation of CUDA
#     (tests/gpu/emu) instead, where there is no GPU: what CI runs (meson's suite 'gpu').
# The first line of output says which: a GPU (its name) or the emulation.
# Runs: the device kernel tests (each kernel vs its host twin), the device engine tests (one rank
# over NCCL), two ranks over NCCL on the one GPU with distinct NCCL_HOSTID, the per-phase kernel
# perf table beside a copy kernel and cuBLAS (>= 1 GB working sets), the two-rank pipelining bench, and a
# PyTorch DDP run with and without LD_PRELOAD of the shim, and lowrank.torch's hook on CUDA buckets
# (tests/python/test_cuda.py, 1 and 2 processes). Fails if any device test skips, any
# check fails, or the DDP losses differ by more than 10%. Meant to finish in under 4 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
emulation=0
[ "${1:-}" = --emulation ] && { emulation=1; shift; }
B=$(realpath "${1:-${LOWRANK_BUILD_DIR:-build-device}}")
OUTDIR=${OUT:-$(mktemp -d)}
fail=0
note() { printf '\n=== %s\n' "$*"; }
bad() { echo "FAILED: $*"; fail=1; }

if [ $emulation = 1 ]; then
  echo "running on: the CPU emulation of CUDA (tests/gpu/emu) and the NCCL test double, not a GPU"
  [ -f "$B/build.ninja" ] || { echo "no build at $B (meson setup $B -Dcuda=enabled)"; exit 2; }
  meson test -C "$B" --suite gpu --print-errorlogs 2>&1 | tee "$OUTDIR/gpu_emulated.log" | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):'
  rc=${PIPESTATUS[0]}
  grep -h "device engine tests on: CPU emulation" "$B"/meson-logs/testlog.txt | sort -u
  [ "$rc" = 0 ] && echo "device checks on the emulation: all passed" || echo "device checks on the emulation: FAILED"
  exit "$rc"
fi
command -v nvidia-smi >/dev/null && echo "running on: $(nvidia-smi -L | head -1)" || {
  echo "no GPU here (nvidia-smi not found); --emulation runs the device tests on the CPU emulation"; exit 2; }
[ -x "$B/tests/gpu/test_cuda_kernels" ] || { echo "no CUDA build at $B: run tests/gpu/pack_for_device.sh on the build machine and carry $B"; exit 2; }

# NCCL: PyTorch's wheel on the GPU machine, else the CUDA toolkit's.
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | grep -v nccl_shim | grep -v nccl_double | head -1)")
echo "NCCL: $NCCL_DIR"
CUDA_LIB=${CUDA_HOME:-/usr/local/cuda}/lib64
export LD_LIBRARY_PATH="$B/device-libs:$B:$NCCL_DIR:$CUDA_LIB:${LD_LIBRARY_PATH:-}"
export LOWRANK_CUDA_BACKEND="$B/plugin/engine/cuda/liblowrank_cuda.so"
# cuSOLVER (orthonormalization for k > 32): the toolkit's or a wheel's; without it those factors
# take the one-block kernel and the tests still pass.
CUSOLVER=$(find "$CUDA_LIB" $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  -name libcusolver.so.12 2>/dev/null | head -1)
# (Set either way, so that the loader's test checks what it finds instead of skipping.)
export LOWRANK_CUSOLVER_LIBRARY="${CUSOLVER:-/nonexistent/libcusolver.so.12}"
echo "cuSOLVER: ${CUSOLVER:-none found (k > 32 is orthonormalized by the one-block kernel)}"
export UCX_TLS=tcp,self UCX_WARN_UNUSED_ENV_VARS=n

gtests() {  # name binary: runs a GoogleTest binary; any skip is a failure where a device is present
  note "$1"
  local log="$OUTDIR/$1.log"
  timeout 120 "$2" 2>&1 | tee "$log" | grep -E '^\[  (FAILED|SKIPPED|PASSED) |^\[==========\]|Failure|error' | head -60
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || bad "$1 exited $rc"
  grep -q '^\[  SKIPPED \]' "$log" && bad "$1: a device test skipped although a device is present"
  grep -q '^\[  PASSED  \]' "$log" || bad "$1: no test passed"
}
gtests gpu_kernels "$B/tests/gpu/test_cuda_kernels"
gtests gpu_engine "$B/tests/gpu/test_cuda_engine"

note "two ranks over NCCL on one GPU (NCCL_HOSTID distinct per process)"
W="$B/tests/gpu/two_rank_worker"
tests/gpu/two_rank_check.sh "$W" "$OUTDIR" || bad "two-rank check"

note "kernel perf: each phase vs a copy kernel, >= 1 GB working sets"
timeout 90 "$B/perf/cuda/lowrank_cuda_kernel_perf" ${KERNEL_PERF_ARGS:-} 2>&1 | tee "$OUTDIR/kernel_perf.txt" || bad "kernel perf"
timeout 30 "$B/perf/cuda/lowrank_cuda_kernel_perf" -k 64,128 -d f32 -m square -p ortho -r 5 2>&1 | grep -v '^# bytes' | tee -a "$OUTDIR/kernel_perf.txt" || bad "kernel perf, k > 32"

note "pipelining with two ranks: time vs max(compute, communication)"
# Two processes on one GPU time-slice it unless MPS lets their kernels run side by side; without
# MPS one rank's NCCL kernel waits for data while the other rank's compute cannot run, so the
# bench runs under MPS when the machine has it (and once without, for comparison).
bench() {
  local id; id=$(mktemp -u)
  for r in 0 1; do NCCL_HOSTID=lowrank-host$r timeout 100 "$W" bench $r 2 "$id" ${BENCH_ELEMENTS:-67108864} 4 & done
  wait %1 || bad "bench rank 0"; wait %2 || bad "bench rank 1"
}
echo "-- time-sliced (no MPS)"; bench
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  if nvidia-cuda-mps-control -d; then
    sleep 1; echo "-- under MPS"; bench
    echo quit | nvidia-cuda-mps-control; sleep 1
  else echo "MPS daemon did not start"; fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

note "PyTorch DDP, 200 steps, with and without LD_PRELOAD of the shim"
SHIM=$(find "$B" -name liblowrank_nccl.so -type f | head -1)
ddp() {  # NPROC [extra args]: prints the final loss of comm rank 0; the log goes to $OUTDIR
  local n=$1 tag=$2; shift 2
  timeout 100 torchrun --standalone --nproc_per_node="$n" tests/gpu/ddp_shim_check.py "$@" \
    >"$OUTDIR/ddp_$tag.log" 2>&1 || echo "torchrun ($tag) exited $?" >&2
  awk '/^final_loss/ {print $2; exit}' "$OUTDIR/ddp_$tag.log"
}
within10() { python3 -c "import sys; a, b = float('${1:-nan}'), float('${2:-nan}'); sys.exit(0 if abs(b - a) <= 0.1 * abs(a) else 1)"; }
plain=$(ddp 1 plain)
shim=$(LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO ddp 1 shim)
grep -h 'calls compressed' "$OUTDIR/ddp_shim.log" | tail -2
echo "one process: final loss plain $plain, with the shim $shim"
within10 "$plain" "$shim" || bad "DDP final loss with the shim not within 10% of the plain run"
grep -qE '[1-9][0-9]* calls compressed' "$OUTDIR/ddp_shim.log" || bad "the shim's report shows no compressed call"
if [ "${SKIP_DDP2:-0}" != 1 ]; then
  plain2=$(ddp 2 plain2 --distinct-hostid)
  shim2=$(LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO ddp 2 shim2 --distinct-hostid)
  grep -h 'calls compressed' "$OUTDIR/ddp_shim2.log" | tail -2
  echo "two processes (distinct NCCL_HOSTID): final loss plain $plain2, with the shim $shim2"
  within10 "$plain2" "$shim2" || bad "two-process DDP: loss with the shim not within 10%"
  grep -qE '[1-9][0-9]* calls compressed' "$OUTDIR/ddp_shim2.log" || bad "two-process DDP: no compressed call"
fi

note "lowrank.torch on CUDA: DDP over NCCL with lowrank's hook (pytest, 1 and 2 processes)"
# PyTorch's own Python on that machine, the package in-tree, pytest from the pack (device-py).
if PYTHONPATH="python:${PYTHONPATH:-}:$B/device-py/site" python3 -c 'import torch, pytest' 2>/dev/null; then
  LOWRANK_LIBRARY="$B/liblowrank.so" PYTHONPATH="python:${PYTHONPATH:-}:$B/device-py/site" \
    timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda.py 2>&1 \
    | tee "$OUTDIR/pytest_cuda.log" | tail -15
  [ "${PIPESTATUS[0]}" = 0 ] || bad "tests/python/test_cuda.py failed"
  grep -q skipped "$OUTDIR/pytest_cuda.log" && bad "tests/python/test_cuda.py skipped although a device is present"
else
  bad "no torch or pytest for python3 here: tests/python/test_cuda.py not run"
fi

note "summary"
[ -n "$CUSOLVER" ] || echo "NOTE: no libcusolver.so.12 found: the dense-QR orthonormalization (k > 32) was not run on the device (its fallback was)"
[ $fail = 0 ] && echo "device checks: all passed" || echo "device checks: FAILED"
exit $fail
