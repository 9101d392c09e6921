#!/usr/bin/env bash
# The device checks of the CUDA backend, the hook and the NCCL shim, for a machine with a GPU (they
# cannot run on the CPU machines where CI runs): one prepared, unattended run of at most 8 minutes
# (LOWRANK_CHECK_BUDGET seconds, default 470), each step under its own timeout and the budget left,
# so that one hang does not eat the rest. Results go to RESULTS_DIR (default
# perf/results/device/<UTC time>, under $OUT when set, as on a lent device machine): summary.md
# (one row per step: passed, FAILED, or not run for lack of budget, with its seconds), versions.txt
# and each step's log. Brings what it needs: a build made by tests/gpu/pack_for_device.sh
# (build-device/, with UCX's libraries in build-device/device-libs), carried to the GPU machine;
# NCCL and CUDA come from that machine (PyTorch's NCCL wheel).
#   tests/gpu/run_device_checks.sh [BUILD_DIR]       (default build-device)
#   tests/gpu/run_device_checks.sh --emulation [BUILD_DIR]
#     the device tests (kernels, engine, two ranks, dead peer, schedule mutants) on the CPU
#     emulation of CUDA (tests/gpu/emu) instead, where there is no GPU: what CI runs (meson's
#     suite 'gpu').
# The first line of output says which: a GPU (its name) or the emulation.
# Steps on a GPU (issue 26, item 7): versions and architectures; the kernel tests and the engine
# tests (each kernel vs its host twin; the device engine vs the host engine, tensor ids, bounded
# waits, the 200-call non-blocking-stream stress); compute-sanitizer racecheck and synccheck on
# the pass and orthonormalization kernels; two ranks over NCCL on the one GPU (distinct
# NCCL_HOSTID); a peer killed mid-call; memory pressure; kernel perf at k = 4 and 32 in f32 and
# bf16; DDP time per step for exact, PyTorch's hook and lowrank's on a ResNet-18-sized model (2
# ranks, under MPS when available); SyncBatchNorm with find_unused_parameters and jitter under a
# timeout; PyTorch DDP with and without LD_PRELOAD of the shim, and with a nonblocking NCCL
# communicator; lowrank.torch's CUDA tests. Fails if any step fails or any device test skips.
set -uo pipefail
cd "$(dirname "$0")/../.."
emulation=0
[ "${1:-}" = --emulation ] && { emulation=1; shift; }
B=$(realpath "${1:-${LOWRANK_BUILD_DIR:-build-device}}")
OUTDIR=${RESULTS_DIR:-${OUT:+$OUT/}perf/results/device/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUTDIR"
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
DEADLINE=$(( $(date +%s) + ${LOWRANK_CHECK_BUDGET:-470} ))
echo "results: $OUTDIR"
printf '| step | result | seconds |\n|---|---|---|\n' >"$OUTDIR/summary.md"

# step NAME SECONDS CMD...: CMD under min(SECONDS, budget left), its output in NAME.log (and
# shown); a row of summary.md. Not run once less than 10 s of the budget is left.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  note "$name"
  if [ "$left" -lt 10 ]; then
    echo "not run: the 8-minute budget is spent"; echo "| $name | not run (budget spent) | 0 |" >>"$OUTDIR/summary.md"; fail=1; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0; t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  local rc=$?
  tail -n "${SHOW_LINES:-15}" "$OUTDIR/$name.log"
  local took=$(( $(date +%s) - t0 )) result=passed
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && result="FAILED (timed out after ${limit} s)"
  [ "$rc" != 0 ] && [ "$result" = passed ] && result="FAILED (exit $rc)"
  [ "$result" = passed ] || bad "$name: $result"
  echo "| $name | $result | $took |" >>"$OUTDIR/summary.md"
}
# gtest NAME BINARY SECONDS [ARGS]: as step, and a skip is a failure where a device is present.
gtest() {
  local name=$1 bin=$2 limit=$3; shift 3
  step "$name" "$limit" "$bin" "$@"
  grep -q '^\[  SKIPPED \]' "$OUTDIR/$name.log" && bad "$name: a device test skipped although a device is present"
  grep -q '^\[  PASSED  \]' "$OUTDIR/$name.log" || bad "$name: no test passed"
}

# NCCL: PyTorch's wheel on the GPU machine, else the CUDA toolkit's.
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | grep -v nccl_shim | grep -v nccl_double | head -1)")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDA_LIB=$CUDA_HOME/lib64
export LD_LIBRARY_PATH="$B/device-libs:$B:$NCCL_DIR:$CUDA_LIB:${LD_LIBRARY_PATH:-}"
export LOWRANK_CUDA_BACKEND="$B/plugin/engine/cuda/liblowrank_cuda.so"
# cuSOLVER (orthonormalization for k > 32): the toolkit's or a wheel's; without it those factors
# take the one-block kernel and the tests still pass.
CUSOLVER=$(find "$CUDA_LIB" $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  -name libcusolver.so.12 2>/dev/null | head -1)
# (Set either way, so that the loader's test checks what it finds instead of skipping.)
export LOWRANK_CUSOLVER_LIBRARY="${CUSOLVER:-/nonexistent/libcusolver.so.12}"
export UCX_TLS=tcp,self UCX_WARN_UNUSED_ENV_VARS=n
W="$B/tests/gpu/two_rank_worker"
SHIM=$(find "$B" -name liblowrank_nccl.so -type f | head -1)
PYPATH="python:${PYTHONPATH:-}:$B/device-py/site"

{
  echo "date: $(date -u)"; echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
  echo "NCCL: $NCCL_DIR"; echo "cuSOLVER: ${CUSOLVER:-none found (k > 32 is orthonormalized by the one-block kernel)}"
  strings "$LOWRANK_CUDA_BACKEND" | grep -m1 '^cuda=' | sed 's/^/backend build: /'
  "$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "arch list", torch.cuda.get_arch_list())' 2>&1
  command -v nvidia-cuda-mps-control >/dev/null && echo "MPS: available" || echo "MPS: not available"
} | tee "$OUTDIR/versions.txt"

gtest gpu_kernels "$B/tests/gpu/test_cuda_kernels" 60
gtest gpu_engine "$B/tests/gpu/test_cuda_engine" 90
SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
for tool in racecheck synccheck; do
  step "sanitizer_$tool" 45 "$SAN" --tool "$tool" --error-exitcode 3 "$B/tests/gpu/test_cuda_kernels" \
    --gtest_filter='*Pass1*:*Pass2*:*Pass3*:*Orthonormalize*'
done
step two_ranks 45 tests/gpu/two_rank_check.sh "$W" "$(mktemp -d)"
step dead_peer 40 python3 tests/gpu/dead_peer_check.py "$W" 5
step memory_pressure 30 "$W" memory 0 1 "$(mktemp -u)"
step kernel_perf 45 "$B/perf/cuda/lowrank_cuda_kernel_perf" -k 4,32 -d f32,bf16 -r 5

# Two processes on one GPU time-slice it unless MPS lets their kernels run side by side.
MPS=0
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  nvidia-cuda-mps-control -d && { MPS=1; sleep 1; }
fi
echo "MPS for the two-process steps: $([ $MPS = 1 ] && echo on || echo off)" | tee -a "$OUTDIR/versions.txt"
step ddp_time_resnet18 90 env PYTHONPATH="$PYPATH" LOWRANK_LIBRARY="$B/liblowrank.so" \
  torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_device_check.py --mode time --distinct-hostid --steps 30
grep -h '^{' "$OUTDIR/ddp_time_resnet18.log" >"$OUTDIR/ddp_time_resnet18.jsonl" || true
step syncbn_unused_jitter 60 env PYTHONPATH="$PYPATH" LOWRANK_LIBRARY="$B/liblowrank.so" \
  torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_device_check.py --mode syncbn --distinct-hostid --steps 40
grep -q '^syncbn ok' "$OUTDIR/syncbn_unused_jitter.log" || bad "syncbn: no 'syncbn ok' line"
[ $MPS = 1 ] && { echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }

# The shim: one process, 200 steps, without and with LD_PRELOAD (losses within 10%), and with a
# nonblocking NCCL communicator (ncclInProgress waited out).
ddp_loss() { awk '/^final_loss/ {print $2; exit}' "$OUTDIR/$1.log"; }
within10() { python3 -c "import sys; a, b = float('${1:-nan}'), float('${2:-nan}'); sys.exit(0 if abs(b - a) <= 0.1 * abs(a) else 1)"; }
step ddp_plain 40 torchrun --standalone --nproc_per_node=1 tests/gpu/ddp_shim_check.py
step ddp_shim 40 env LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO \
  torchrun --standalone --nproc_per_node=1 tests/gpu/ddp_shim_check.py
step ddp_shim_nonblocking 40 env LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO \
  TORCH_NCCL_USE_COMM_NONBLOCKING=1 torchrun --standalone --nproc_per_node=1 tests/gpu/ddp_shim_check.py
echo "final loss: plain $(ddp_loss ddp_plain), shim $(ddp_loss ddp_shim), shim nonblocking $(ddp_loss ddp_shim_nonblocking)" \
  | tee -a "$OUTDIR/summary.md"
for t in ddp_shim ddp_shim_nonblocking; do
  within10 "$(ddp_loss ddp_plain)" "$(ddp_loss $t)" || bad "$t: final loss not within 10% of the plain run"
  grep -qE '[1-9][0-9]* calls compressed' "$OUTDIR/$t.log" || bad "$t: the shim's report shows no compressed call"
done

# lowrank.torch on CUDA: DDP over NCCL with lowrank's hook (pytest, 1 and 2 processes).
if PYTHONPATH="$PYPATH" python3 -c 'import torch, pytest' 2>/dev/null; then
  step pytest_cuda 75 env LOWRANK_LIBRARY="$B/liblowrank.so" PYTHONPATH="$PYPATH" \
    python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda.py
  grep -q skipped "$OUTDIR/pytest_cuda.log" && bad "tests/python/test_cuda.py skipped although a device is present"
else
  bad "no torch or pytest for python3 here: tests/python/test_cuda.py not run"
fi

note "summary ($OUTDIR/summary.md)"
cat "$OUTDIR/summary.md"
[ -n "$CUSOLVER" ] || echo "NOTE: no libcusolver.so.12 found: the dense-QR orthonormalization (k > 32) was not run on the device (its fallback was)"
[ $fail = 0 ] && echo "device checks: all passed" || echo "device checks: FAILED"
exit $fail
