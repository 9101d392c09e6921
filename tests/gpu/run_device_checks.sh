#!/usr/bin/env bash
# The device checks of the CUDA backend and the NCCL shim, for a machine with a GPU (they cannot
# run on the CPU machines where CI runs). Brings what it needs: a build made by
# tests/gpu/pack_for_device.sh (build-device/, with UCX's libraries in build-device/device-libs),
# carried to the GPU machine; NCCL and CUDA come from that machine (PyTorch's NCCL wheel).
#   tests/gpu/run_device_checks.sh [BUILD_DIR]       (default build-device)
# Runs: the device kernel tests (each kernel vs its host twin), the device engine tests (one rank
# over NCCL), two ranks over NCCL on the one GPU with distinct NCCL_HOSTID, the per-phase kernel
# perf table beside a copy kernel (>= 1 GB working sets), the two-rank pipelining bench, and a
# PyTorch DDP run with and without LD_PRELOAD of the shim. Fails if any device test skips, any
# check fails, or the DDP losses differ by more than 10%. Meant to finish in under 4 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$(realpath "${1:-${LOWRANK_BUILD_DIR:-build-device}}")
OUTDIR=${OUT:-$(mktemp -d)}
fail=0
note() { printf '\n=== %s\n' "$*"; }
bad() { echo "FAILED: $*"; fail=1; }

command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "no GPU here (nvidia-smi not found)"; exit 2; }
[ -x "$B/tests/gpu/test_cuda_kernels" ] || { echo "no CUDA build at $B: run tests/gpu/pack_for_device.sh on the build machine and carry $B"; exit 2; }

# NCCL: PyTorch's wheel on the GPU machine, else the CUDA toolkit's.
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | grep -v nccl_shim | grep -v nccl_double | head -1)")
echo "NCCL: $NCCL_DIR"
CUDA_LIB=${CUDA_HOME:-/usr/local/cuda}/lib64
export LD_LIBRARY_PATH="$B/device-libs:$B:$NCCL_DIR:$CUDA_LIB:${LD_LIBRARY_PATH:-}"
export LOWRANK_CUDA_BACKEND="$B/plugin/engine/cuda/liblowrank_cuda.so"
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
id=$(mktemp -u); rm -f "$id"
for r in 0 1; do NCCL_HOSTID=lowrank-host$r timeout 120 "$W" check $r 2 "$id" "$OUTDIR/out$r.bin" & done
wait %1; rc0=$?; wait %2; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || bad "two-rank check exited $rc0/$rc1"
cmp -s "$OUTDIR/out0.bin" "$OUTDIR/out1.bin" && echo "outputs bit-identical on both ranks" || bad "outputs differ between ranks"

note "kernel perf: each phase vs a copy kernel, >= 1 GB working sets"
timeout 90 "$B/perf/cuda/lowrank_cuda_kernel_perf" ${KERNEL_PERF_ARGS:-} 2>&1 | tee "$OUTDIR/kernel_perf.txt" || bad "kernel perf"

note "pipelining with two ranks: time vs max(compute, communication)"
id=$(mktemp -u); rm -f "$id"
for r in 0 1; do NCCL_HOSTID=lowrank-host$r timeout 120 "$W" bench $r 2 "$id" ${BENCH_ELEMENTS:-67108864} 4 & done
wait %1 || bad "bench rank 0"; wait %2 || bad "bench rank 1"

note "PyTorch DDP, 200 steps, with and without LD_PRELOAD of the shim"
SHIM=$(find "$B" -name liblowrank_nccl.so -type f | head -1)
ddp() { timeout 150 torchrun --standalone --nproc_per_node=1 tests/gpu/ddp_shim_check.py 2>&1; }
plain=$(ddp | tee "$OUTDIR/ddp_plain.log" | awk '/^final_loss/ {print $2}')
shim=$(LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO ddp | tee "$OUTDIR/ddp_shim.log" | awk '/^final_loss/ {print $2}')
grep -E 'LOWRANK INFO .*(compressed|exit)' "$OUTDIR/ddp_shim.log" | tail -3
echo "final loss: plain $plain, with the shim $shim"
python3 -c "import sys; a, b = float('$plain' or 'nan'), float('$shim' or 'nan'); sys.exit(0 if abs(b - a) <= 0.1 * abs(a) else 1)" \
  || bad "DDP final loss with the shim not within 10% of the plain run"
grep -qE 'compressed [1-9]' "$OUTDIR/ddp_shim.log" || bad "the shim's exit line shows no compressed call"

note "summary"
[ $fail = 0 ] && echo "device checks: all passed" || echo "device checks: FAILED"
exit $fail
