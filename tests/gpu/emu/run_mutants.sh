#!/usr/bin/env bash
# Every mutant of the device schedule (mutants.py) must fail the emulated device engine tests:
# first the check that caught it before (mutants.py first: the two-rank check or a gtest filter),
# then, if that passes, the one-rank tests (stopping at the first failure), else the two-rank
# check. Prints, per mutant, what it breaks and the test that caught it with its first failure
# message; fails if any mutant passes them all. Run by meson (gpu_engine_mutants_caught).
#   run_mutants.sh PYTHON MUTANTS_PY ENGINE_TEST TWO_RANK_WORKER BACKEND_DIR
set -u
PY=$1 MUTANTS=$2 ENGINE=$3 WORKER=$4 DIR=$5
CHECK="$(dirname "$0")/../two_rank_check.sh"
missed=0
# A mutant that waits without bound (save_unbounded) is named by the emulation after this long,
# not its default 30 s: the engine's own bounded waits in these tests are 2 s.
export LOWRANK_EMU_UNBOUNDED_WAIT_S=8
engine() {  # engine LOG [GTEST ARGS]: 0 when the tests pass
  local log=$1; shift
  timeout 600 "$ENGINE" --gtest_fail_fast "$@" >"$log" 2>&1
}
report_engine() {  # a test that failed, or the last words of one that aborted (a watchdog)
  local failed
  failed=$(grep -m1 '^\[  FAILED  \]' "$2")
  echo "caught by the engine tests$1: ${failed:-the run ended with no FAILED line, its last lines:}"
  if [ -n "$failed" ]; then grep -m1 -A3 -E 'Failure$' "$2"; else tail -3 "$2"; fi | sed 's/^/    /'
}
report_two_rank() {
  echo "caught by the two-rank check$1:"
  grep -m3 -E 'FAILED' "$2" | sed 's/^/    /'
}
one() {  # one MUTANT: its report on stdout; status 1 if nothing caught it
  local m=$1 log first
  echo "=== mutant $m: $("$PY" "$MUTANTS" describe "$m")"
  export LOWRANK_CUDA_BACKEND="$DIR/liblowrank_cuda_emu_$m.so"
  [ -f "$LOWRANK_CUDA_BACKEND" ] || { echo "no backend $LOWRANK_CUDA_BACKEND"; return 1; }
  log=$(mktemp)
  first=$("$PY" "$MUTANTS" first "$m")
  local rc=0
  if [ "$first" = two-rank ] && ! "$CHECK" "$WORKER" >"$log" 2>&1; then
    report_two_rank " (tried first)" "$log"
  elif [ -n "$first" ] && [ "$first" != two-rank ] && ! engine "$log" --gtest_filter="$first"; then
    report_engine " (tried first: $first)" "$log"
  elif ! engine "$log"; then
    report_engine "" "$log"
  elif ! "$CHECK" "$WORKER" >"$log" 2>&1; then
    report_two_rank " (the one-rank tests passed)" "$log"
  else
    echo "NOT CAUGHT: the engine tests and the two-rank check pass with this mutant"
    rc=1
  fi
  rm -f "$log"
  return $rc
}
# Two mutants at a time (MUTANT_JOBS): each run is one process on one core, and the second core is
# idle by then in CI (the sanitizer builds are done). Reports print in the list's order.
jobs=${MUTANT_JOBS:-2}
out=$(mktemp -d)
i=0
for m in $("$PY" "$MUTANTS" list | cut -d' ' -f1); do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  ( one "$m" >"$out/$(printf %03d $i)" 2>&1 || touch "$out/$(printf %03d $i).missed" ) &
  i=$((i + 1))
done
wait
for f in "$out"/[0-9][0-9][0-9]; do
  cat "$f"
  [ -e "$f.missed" ] && missed=1
done
rm -rf "$out"
[ $missed = 0 ] && echo "every mutant caught" || echo "FAILED: some mutant was not caught"
exit $missed
