#!/usr/bin/env bash
# Builds the host library, the shim and their tests under one sanitizer, in a build directory of
# its own (${LOWRANK_BUILD_DIR:-build}-asan or -tsan), and runs the suites named below. Any report
# is a failure: each process writes its reports under BUILD/sanitizer-reports (log_path; UBSan's
# are copied there from the test log), which scripts/count_tests.py counts as failed tests, so a
# report from a child process whose exit status a driver ignores still fails the run. Ends with
# count_tests.py's lines. .ci/run runs both.
#   scripts/sanitize.sh address|thread [--build-only | meson test options...]
# --build-only: configure and build what the tests need, run nothing (.ci/run builds both at nice 19
# while the main tests run, on the CPU time they leave idle).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:?usage: sanitize.sh address|thread [--build-only | meson test options...]}
shift
build_only=
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi
supp=$root/tests/sanitizers
case $kind in
  # address: ASan + UBSan; the engine, transport, API, shim and NCCL suites, the multi-process
  # ones, and the device engine and kernels on the CPU emulation of CUDA (suite gpu).
  address) build=${LOWRANK_BUILD_DIR:-$root/build}-asan
    sanitize=address,undefined
    select=(engine transport api c_consumer :nccl :shim :multiprocess :gpu)
    # Left out: exports (nm only); the mutants (rebuilds of the device schedule that must fail);
    # the kernel tests on the emulation (3 min here; the engine tests run the same kernels); the
    # engine tests in the default stream order: they run here in the random one (the same memory
    # touched), which .ci/run leaves to this build (the release build runs the default order); the
    # GPU script's emulated steps (its two-rank check runs here as gpu_two_ranks_emulated; the rest
    # is the kernels, left out above: about 60 s under ASan) and the adaptive check in the default
    # order (the random one runs here; the release build runs both).
    exclude=(shim_exports nccl_double_exports gpu_engine_mutants_caught gpu_kernels_emulated
             gpu_ortho_emulated_without_cusolver gpu_engine_emulated gpu_device_checks_emulated
             gpu_adaptive_same_step_emulated)
    # 200 calls on two streams (51 s under ASan; twice: with and without memory pools): the emulation runs one thread, so the calls add
    # no interleaving, only the same memory touched again; the release build runs them. The
    # sync-call count without memory pools (about 30 s under ASan) checks the emulation's
    # counter, on the DDP-shaped run that its twin with pools runs here; the release build runs it.
    export GTEST_FILTER=-DeviceStreams.TwoHundredCalls*:DeviceSyncCalls.WithoutMemoryPools* ;;
  # thread: what has threads: the engine's progress thread and pipeline, the transports (abort
  # from another thread, timeouts), comm ranks as threads in one process (API, NCCL double), the
  # shim's locks (compressed calls, groups, destroy and abort, a dead peer). The emulation is
  # single-threaded; the other shim cases and the multi-process ones add data, not interleavings.
  thread) build=${LOWRANK_BUILD_DIR:-$root/build}-tsan
    sanitize=thread
    select=(engine transport api nccl_double nccl_init nccl_init_rank nccl_transport
            shim_mixed shim_groups shim_destroy shim_peerdeath)
    exclude=()
    # size sweeps of the transport: the same threads over more data (50 s under TSan)
    export GTEST_FILTER=-Allreduce.RanksAndCountsWithDefaultAlgorithms:Allreduce.TcpSelfTransports ;;
  *) echo "usage: sanitize.sh address|thread" >&2; exit 2 ;;
esac
reports=$build/sanitizer-reports

# -Og -g1: line numbers in reports at a third of -O1 -g's compile time under UBSan.
# torch_python empty: no Python tests (the interpreter is not sanitized).
flags="-Og -g1 -fno-omit-frame-pointer"
if [ ! -f "$build/build.ninja" ]; then
  nice -n 19 meson setup "$build" "$root" --buildtype=plain -Db_sanitize=$sanitize \
    -Dc_args="$flags" -Dcpp_args="$flags" -Dcuda=auto -Dtorch_python= -Dtorch2_python= \
    >"${TMPDIR:-/tmp}/sanitize-setup.log" 2>&1 \
    || { cat "${TMPDIR:-/tmp}/sanitize-setup.log"; echo "0 passed, 1 failed (setup)"; exit 1; }
fi
sel=$(python3 "$root/scripts/sanitize_select.py" "$build" "${select[@]}" --exclude "${exclude[@]:-}") \
  || { echo "0 passed, 1 failed (test selection)"; exit 1; }
read -ra tests <<<"$(sed -n 's/^tests //p' <<<"$sel")"
read -ra targets <<<"$(sed -n 's/^targets //p' <<<"$sel")"
nice -n 19 ninja -C "$build" "${targets[@]}" || { echo "0 passed, 1 failed (build)"; exit 1; }
[ -n "$build_only" ] && exit 0

# The same environment hygiene as scripts/test.sh: stray LOWRANK_* variables change what tests check.
for v in $(env | grep -oE '^LOWRANK_[A-Z0-9_]+=' | tr -d = | grep -vxE 'LOWRANK_BUILD_DIR'); do
  unset "$v"
done
# tests/sanitizers/TOOL.supp: suppressions (third-party code only), each with its reason.
supp_of() { [ -f "$supp/$1.supp" ] && echo ":suppressions=$supp/$1.supp"; }
common="halt_on_error=1:log_path=$reports/report"
# verify_asan_link_order=0: the shim's tests LD_PRELOAD it ahead of the runtime the app links.
export ASAN_OPTIONS="$common:detect_leaks=1:verify_asan_link_order=0"
export LSAN_OPTIONS="print_suppressions=0$(supp_of lsan)"
export UBSAN_OPTIONS="$common:print_stacktrace=1$(supp_of ubsan)"
export TSAN_OPTIONS="$common:second_deadlock_stack=1$(supp_of tsan)"
# UCX's memory hooks off: UCM would patch malloc/mmap (to keep RDMA registration caches right)
# beside the sanitizers' own interposition; over TCP and shared memory nothing needs them (the
# tests pass without these too, with UCX 1.13: they make it certain, not accidental).
export UCX_MEM_MALLOC_HOOKS=n UCX_MEM_MMAP_HOOK_MODE=none

rm -rf "$build/tests/reports" "$build"/meson-logs/testlog.{json,txt} "$reports"
mkdir -p "$build/tests/reports" "$reports"
nice -n 19 meson test -C "$build" --no-rebuild --print-errorlogs --num-processes 1 "${tests[@]}" "$@"
rc=$?
# GCC's UBSan, beside ASan, ignores log_path and writes to stderr: its reports are found in the
# test log (halt_on_error also fails the process that hit one).
grep -h "runtime error:" "$build/meson-logs/testlog.txt" >"$reports/ubsan-in-test-log" \
  || rm -f "$reports/ubsan-in-test-log"
for f in "$reports"/*; do [ -e "$f" ] && { echo "--- sanitizer report $f:"; head -60 "$f"; }; done
python3 "$root/scripts/count_tests.py" "$build" || rc=1
exit $rc
