#!/usr/bin/env bash
# The device checks of the CUDA backend, the hook and the NCCL shim on a machine with a GPU, as one
# prepared, unattended run of at most 8 minutes; with --emulated, its steps that can run on the CPU
# emulation of CUDA (tests/gpu/emu) and the NCCL test double, so that CI keeps the script itself
# working (meson test gpu_device_checks_emulated, suite gpu).
#   tests/gpu/run_device_checks.sh [BUILD_DIR]             (default build-device: pack_for_device.sh)
#   tests/gpu/run_device_checks.sh --emulated [BUILD_DIR]  (default build; the emulation's
#       variables as meson's gpu tests set them: LOWRANK_CUDA_BACKEND, LOWRANK_NCCL_LIBRARY, ...)
# Rules:
# - Every step runs under `timeout`, at most its cap (CAPS below) or the time left; the caps add up
#   to at most 480 s (8 minutes; checked before anything runs). Every other command is under
#   `timeout` too: the probes of the set-up (at most PROBE_S each, counted in the cap "setup").
# - A step passes, FAILS (lowrank's failure: its exit status, a timeout, a check of its output),
#   or is "not available": the machine refuses it (exit 77: compute-sanitizer refused, a device
#   that cannot report its free memory, MPS that does not start) or lacks what it needs (torch
#   with CUDA; a GPU, under --emulated). Only failures fail the run (exit 1).
# - GoogleTest steps leave out by name the emulation-only tests (gtest filter -*Emulat*: they need
#   the NCCL test double or the emulation's dependency graph) and, with fewer than two GPUs, the
#   two-device ones (*TwoDevices*); a test that still skips is a failure.
# - Results: one folder, RESULTS_DIR (default $OUT/device_checks where $OUT is set, as on a lent
#   device machine, else perf/results/device/<UTC time>), of at most 10 plain files: summary.md,
#   written first and rewritten after every step (step, result, seconds, cap; then the failed
#   checks and notes), so that a run cut short still has it; versions.log; one log per group of
#   steps (tests, ranks, perf, ddp, pytest), each step's output under its "=== step" line; and
#   ddp_time.jsonl.
# Steps on a GPU (issue 26, item 7; issue 41, item 4): versions and architectures; the kernel
# tests and the engine tests (each kernel vs its host twin; the device engine vs the host engine,
# tensor ids, the 200-call non-blocking-stream stress, two devices where there are two);
# compute-sanitizer racecheck and synccheck on the pass and orthonormalization kernels
# (sanitize_kernels.sh); two ranks over NCCL on the one GPU (distinct NCCL_HOSTID); a peer killed
# mid-call; memory pressure; kernel perf at k = 4 and 32 in f32 and bf16; DDP time per step for
# exact, PyTorch's hook and lowrank's on a ResNet-18-sized model (2 ranks, under MPS when it
# starts); SyncBatchNorm with find_unused_parameters and jitter under a timeout; PyTorch DDP with
# and without LD_PRELOAD of the shim, and with a nonblocking NCCL communicator; lowrank.torch's
# CUDA tests. Under --emulated: the kernel and engine tests (a short subset), two ranks, the dead
# peer and memory pressure (not available there) on the emulation; the rest "not available".
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
emulated=0
[ "${1:-}" = --emulated ] && { emulated=1; shift; }
if [ $emulated = 1 ]; then B=$(realpath "${1:-${LOWRANK_BUILD_DIR:-build}}")
else B=$(realpath "${1:-${LOWRANK_BUILD_DIR:-build-device}}"); fi

# The caps in seconds, in the order the steps run. Their sum: 480 s (8 minutes), the budget.
CAPS="setup:30 versions:10 gpu_kernels:45 gpu_engine:55 sanitizer_racecheck:30
  sanitizer_synccheck:30 two_ranks:30 dead_peer:25 memory_pressure:15 kernel_perf:25 mps_start:5
  ddp_time_resnet18:50 syncbn_unused_jitter:35 mps_stop:5 ddp_plain:20 ddp_shim:20
  ddp_shim_nonblocking:20 pytest_cuda:30"
BUDGET=480 PROBE_S=5
declare -A CAP
total=0
for c in $CAPS; do CAP[${c%%:*}]=${c#*:}; total=$((total + ${c#*:})); done
[ $total -le $BUDGET ] || { echo "run_device_checks.sh: the caps add up to $total s, over the $BUDGET s budget"; exit 2; }
# On the CPU emulation (CI, often under ASan) nothing is leased and a step runs several times
# slower than on a GPU: every cap and the budget are tripled there (the two-rank check, with the
# alternating schedule's checks, takes about 60 s under ASan on 2 cores).
if [ $emulated = 1 ]; then
  for k in "${!CAP[@]}"; do CAP[$k]=$(( CAP[$k] * 3 )); done
  BUDGET=$(( BUDGET * 3 ))
fi
DEADLINE=$(( $(date +%s) + BUDGET ))
probe() { timeout -k 1 "$PROBE_S" "$@"; }

OUTDIR=${RESULTS_DIR:-${OUT:+$OUT/device_checks}}
OUTDIR=${OUTDIR:-perf/results/device/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUTDIR"
# An earlier run's files in the same folder go (only the names written here).
rm -f "$OUTDIR"/{summary.md,versions.log,tests.log,ranks.log,perf.log,ddp.log,pytest.log,ddp_time.jsonl}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LAST=$TMP/last.log ROWS=$TMP/rows NOTES=$TMP/notes
: >"$ROWS"; : >"$NOTES"
fail=0 STATUS="running (started $(date -u +%H:%M:%SZ))" WHERE=unknown

write_summary() {
  { echo "# Device checks on $WHERE"; echo; echo "**$STATUS**"; echo
    echo "| step | result | seconds | cap |"; echo "|---|---|---|---|"; cat "$ROWS"; echo
    cat "$NOTES"; } >"$OUTDIR/summary.md"
}
row() {  # row STEP RESULT SECONDS
  echo "| $1 | $2 | $3 | ${CAP[$1]:-} |" >>"$ROWS"
  case $2 in FAILED*) fail=1 ;; esac
  write_summary
}
note() { echo "- $*" >>"$NOTES"; write_summary; }
check() { echo "FAILED: $1: $2"; note "FAILED: $1: $2"; fail=1; }  # a failed check of a step's output
unavailable() { printf '\n=== %s\nnot available: %s\n' "$1" "$2"; row "$1" "not available ($2)" 0; }

# step NAME GROUP CMD...: CMD under timeout (its cap or the time left), its output appended to
# GROUP.log under a header and kept in $LAST for the checks after it; one row of summary.md.
# Exit 77 is "not available" (its last line says why). Returns 0 only if it passed.
step() {
  local name=$1 group=$2; shift 2
  local cap=${CAP[$name]:?"no cap for step $name"} left=$(( DEADLINE - $(date +%s) )) limit
  limit=$(( cap < left ? cap : left ))
  printf '\n=== %s\n' "$name"
  if [ "$limit" -lt 3 ]; then row "$name" "FAILED (not run: the budget is spent)" 0; return 1; fi
  local t0 rc took result=passed
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$LAST" 2>&1
  rc=$? took=$(( $(date +%s) - t0 ))
  { echo "=== step $name (cap $cap s, ran $took s, exit $rc): $*"; cat "$LAST"; echo; } >>"$OUTDIR/$group.log"
  tail -n "${SHOW_LINES:-8}" "$LAST"
  case $rc in
    0) ;;
    77) result="not available ($(grep -v '^ *$' "$LAST" | tail -n 1 | cut -c1-120 | tr '|' '/'))" ;;
    124|137) result="FAILED (timed out after $limit s)" ;;
    *) result="FAILED (exit $rc)" ;;
  esac
  row "$name" "$result" "$took"
  [ $rc = 0 ]
}
# gtest NAME BINARY [ARGS]: as step (group tests), with the filter; a skip or no pass is a failure.
gtest() {
  local name=$1 bin=$2; shift 2
  step "$name" tests "$bin" --gtest_filter="$1" "${@:2}"
  grep -q '^\[  SKIPPED \]' "$LAST" && check "$name" "a test skipped: $(grep -m1 '^\[  SKIPPED \]' "$LAST")"
  grep -q '^\[  PASSED  \]' "$LAST" || check "$name" "no test passed"
}

# ---- where, and what the machine has (probes, cap "setup") --------------------------------------
t0=$(date +%s)
if [ $emulated = 1 ]; then
  WHERE="the CPU emulation of CUDA (tests/gpu/emu) and the NCCL test double, not a GPU"
  K=$B/tests/gpu/emu/test_cuda_kernels_emulated E=$B/tests/gpu/emu/test_cuda_engine_emulated
  W=$B/tests/gpu/emu/two_rank_worker_emulated
  [ -x "$K" ] && [ -x "$E" ] && [ -x "$W" ] || { echo "no emulated device tests in $B (-Dcuda=enabled)"; exit 2; }
  [ -n "${LOWRANK_CUDA_BACKEND:-}" ] || { echo "--emulated runs with the emulation's variables set (meson test gpu_device_checks_emulated)"; exit 2; }
  GPUS=2  # the emulation's two devices
  # A short subset (the whole of both binaries is meson's gpu suite).
  KFILTER='Small.*:Kernels/Pass1.*:Kernels/Orthonormalize.*-*Emulat*'
  EFILTER='DeviceEngine*.*-*Emulat*'
else
  command -v nvidia-smi >/dev/null || { echo "no GPU here (no nvidia-smi); --emulated runs the steps the CPU emulation can"; exit 2; }
  K=$B/tests/gpu/test_cuda_kernels E=$B/tests/gpu/test_cuda_engine W=$B/tests/gpu/two_rank_worker
  [ -x "$K" ] || { echo "no CUDA build at $B: run tests/gpu/pack_for_device.sh on the build machine and carry $B"; exit 2; }
  GPUS=$(probe nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  WHERE=$(probe nvidia-smi -L 2>/dev/null | head -1)
  WHERE="${WHERE:-a GPU that nvidia-smi does not name} ($GPUS GPU(s))"
  KFILTER='-*Emulat*' EFILTER='-*Emulat*'
  [ "$GPUS" -ge 2 ] || { KFILTER+=':*TwoDevices*'; EFILTER+=':*TwoDevices*'; }
  # NCCL: PyTorch's wheel on the GPU machine, else a system one (a bounded search, no `find /`).
  NCCL_DIR=$(probe python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  CUDA_LIB=$CUDA_HOME/lib64
  [ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(probe find "$CUDA_LIB" /usr/lib/x86_64-linux-gnu /usr/local/lib /opt \
    -maxdepth 5 -name libnccl.so.2 2>/dev/null | head -1)")
  # cuSOLVER (orthonormalization for k > 32): the toolkit's or a wheel's; without it those factors
  # take the one-block kernel (set either way, so that the loader's test checks what it finds).
  SITE=$(probe python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  CUSOLVER=$(probe find "$CUDA_LIB" $SITE -maxdepth 5 -name libcusolver.so.12 2>/dev/null | head -1)
  export LOWRANK_CUSOLVER_LIBRARY="${CUSOLVER:-/nonexistent/libcusolver.so.12}"
  export LD_LIBRARY_PATH="$B/device-libs:$B:$NCCL_DIR:$CUDA_LIB:${LD_LIBRARY_PATH:-}"
  export LOWRANK_CUDA_BACKEND="$B/plugin/cuda_backend/liblowrank_cuda.so"
  export UCX_TLS=tcp,self UCX_WARN_UNUSED_ENV_VARS=n
  PYPATH="python:${PYTHONPATH:-}:$B/device-py/site"
  TORCH=$(PYTHONPATH="$PYPATH" probe python3 -c 'import torch, pytest; print(torch.cuda.is_available())' 2>/dev/null)
fi
echo "running on: $WHERE"
echo "results: $OUTDIR"
row setup "passed" $(( $(date +%s) - t0 ))

versions() {
  echo "date: $(date -u)"; echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "build: $B"
  if [ "$1" = gpu ]; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
    echo "NCCL: ${NCCL_DIR:-none found}"; echo "cuSOLVER: ${CUSOLVER:-none found (k > 32 is orthonormalized by the one-block kernel)}"
    grep -a -m1 -o 'cuda=[^"]*cudart=static' "$LOWRANK_CUDA_BACKEND" | sed 's/^/backend build: /'
    "$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1
    PYTHONPATH="$PYPATH" python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "arch list", torch.cuda.get_arch_list())' 2>&1
    command -v nvidia-cuda-mps-control >/dev/null && echo "MPS: available" || echo "MPS: not available"
  else
    echo "backend: $LOWRANK_CUDA_BACKEND"; echo "NCCL: ${LOWRANK_NCCL_LIBRARY:-unset}"
  fi
}
export -f versions
export B NCCL_DIR CUSOLVER CUDA_HOME PYPATH 2>/dev/null
step versions versions bash -c "versions $([ $emulated = 1 ] && echo emulation || echo gpu)"

# ---- device tests -------------------------------------------------------------------------------
gtest gpu_kernels "$K" "$KFILTER"
gtest gpu_engine "$E" "$EFILTER"
if [ $emulated = 1 ]; then
  unavailable sanitizer_racecheck "the emulation: no device to instrument"
  unavailable sanitizer_synccheck "the emulation: no device to instrument"
else
  step sanitizer_racecheck tests tests/gpu/sanitize_kernels.sh racecheck "$K"
  step sanitizer_synccheck tests tests/gpu/sanitize_kernels.sh synccheck "$K"
fi
step two_ranks ranks tests/gpu/two_rank_check.sh "$W" "$TMP"
step dead_peer ranks python3 tests/gpu/dead_peer_check.py "$W" 5
step memory_pressure ranks "$W" memory 0 1 "$TMP/memory-id"

if [ $emulated = 1 ]; then
  for s in kernel_perf mps_start ddp_time_resnet18 syncbn_unused_jitter mps_stop ddp_plain ddp_shim \
           ddp_shim_nonblocking pytest_cuda; do
    unavailable "$s" "needs a GPU (--emulated)"
  done
else
  step kernel_perf perf "$B/perf/cuda/lowrank_cuda_kernel_perf" -k 4,32 -d f32,bf16 -r 5

  # Two processes on one GPU time-slice it unless MPS lets their kernels run side by side.
  MPS=0
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    unavailable mps_start "no nvidia-cuda-mps-control: the two-process steps time-slice the GPU"
  else
    export CUDA_MPS_PIPE_DIRECTORY=$TMP/mps-pipe CUDA_MPS_LOG_DIRECTORY=$TMP/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if step mps_start ddp bash -c 'nvidia-cuda-mps-control -d || { echo "MPS did not start here"; exit 77; }; sleep 1'; then
      MPS=1
    else
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  fi
  note "MPS for the two-process steps: $([ $MPS = 1 ] && echo on || echo off)"
  if [ "$TORCH" != True ]; then
    for s in ddp_time_resnet18 syncbn_unused_jitter ddp_plain ddp_shim ddp_shim_nonblocking pytest_cuda; do
      unavailable "$s" "no torch with CUDA (and pytest) for python3 here"
    done
  else
    TR="env PYTHONPATH=$PYPATH LOWRANK_LIBRARY=$B/liblowrank.so torchrun --standalone"
    step ddp_time_resnet18 ddp $TR --nproc_per_node=2 tests/gpu/ddp_device_check.py --mode time --distinct-hostid --steps 30
    grep -h '^{' "$LAST" >>"$OUTDIR/ddp_time.jsonl"
    step syncbn_unused_jitter ddp $TR --nproc_per_node=2 tests/gpu/ddp_device_check.py --mode syncbn --distinct-hostid --steps 40 &&
      { grep -q '^syncbn ok' "$LAST" || check syncbn_unused_jitter "no 'syncbn ok' line"; }
  fi
  if [ $MPS = 1 ]; then
    step mps_stop ddp bash -c 'echo quit | nvidia-cuda-mps-control || exit 77; sleep 1'
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi

  if [ "$TORCH" = True ]; then
    # The shim: one process, 200 steps, without and with LD_PRELOAD (losses within 10%), and with
    # a nonblocking NCCL communicator (ncclInProgress waited out).
    SHIM=$(probe find "$B" -name liblowrank_nccl.so -type f | head -1)
    declare -A LOSS
    for s in ddp_plain ddp_shim ddp_shim_nonblocking; do
      case $s in
        ddp_plain) pre=() ;;
        ddp_shim) pre=(env LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO) ;;
        *) pre=(env LD_PRELOAD="$SHIM" LOWRANK_APPROX_RANK=4 LOWRANK_DEBUG=INFO TORCH_NCCL_USE_COMM_NONBLOCKING=1) ;;
      esac
      step "$s" ddp "${pre[@]}" torchrun --standalone --nproc_per_node=1 tests/gpu/ddp_shim_check.py
      LOSS[$s]=$(awk '/^final_loss/ {print $2; exit}' "$LAST")
      [ "$s" = ddp_plain ] && continue
      grep -qE '[1-9][0-9]* calls compressed' "$LAST" || check "$s" "the shim's report shows no compressed call"
      python3 -c "import sys; a, b = float('${LOSS[ddp_plain]:-nan}'), float('${LOSS[$s]:-nan}'); sys.exit(0 if abs(b - a) <= 0.1 * abs(a) else 1)" ||
        check "$s" "final loss ${LOSS[$s]:-none} not within 10% of the plain run's ${LOSS[ddp_plain]:-none}"
    done
    note "final loss: plain ${LOSS[ddp_plain]:-none}, shim ${LOSS[ddp_shim]:-none}, shim nonblocking ${LOSS[ddp_shim_nonblocking]:-none}"
    # lowrank.torch on CUDA: DDP over NCCL with lowrank's hook (pytest, 1 and 2 processes).
    step pytest_cuda pytest env LOWRANK_LIBRARY="$B/liblowrank.so" PYTHONPATH="$PYPATH" \
      python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda.py
    grep -q skipped "$LAST" && check pytest_cuda "tests/python/test_cuda.py skipped although a device is present"
  fi
  [ -n "$CUSOLVER" ] || note "no libcusolver.so.12 found: the dense-QR orthonormalization (k > 32) ran its fallback, not cuSOLVER"
fi

# ---- the results folder -------------------------------------------------------------------------
files=$(find "$OUTDIR" -mindepth 1 | wc -l)
[ "$files" -le 10 ] || check results "$OUTDIR holds $files entries, more than 10"
[ -z "$(find "$OUTDIR" -mindepth 1 -not -type f)" ] || check results "$OUTDIR holds something that is not a plain file"
STATUS=$([ $fail = 0 ] && echo "passed (no step failed)" || echo "FAILED")
write_summary
printf '\n=== summary (%s)\n' "$OUTDIR/summary.md"
cat "$OUTDIR/summary.md"
[ $fail = 0 ] && echo "device checks: passed" || echo "device checks: FAILED"
exit $fail
