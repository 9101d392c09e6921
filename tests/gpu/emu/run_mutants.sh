#!/usr/bin/env bash
# Every mutant of the device schedule (mutants.py) must fail the emulated device engine tests:
# first the one-rank tests (stopping at the first failure), else the two-rank check. Prints, per
# mutant, what it breaks and the test that caught it with its first failure message; fails if
# any mutant passes them all. Run by meson (gpu_engine_mutants_caught).
#   run_mutants.sh PYTHON MUTANTS_PY ENGINE_TEST TWO_RANK_WORKER BACKEND_DIR
set -u
PY=$1 MUTANTS=$2 ENGINE=$3 WORKER=$4 DIR=$5
CHECK="$(dirname "$0")/../two_rank_check.sh"
missed=0
for m in $("$PY" "$MUTANTS" list | cut -d' ' -f1); do
  echo "=== mutant $m: $("$PY" "$MUTANTS" describe "$m")"
  export LOWRANK_CUDA_BACKEND="$DIR/liblowrank_cuda_emu_$m.so"
  [ -f "$LOWRANK_CUDA_BACKEND" ] || { echo "no backend $LOWRANK_CUDA_BACKEND"; missed=1; continue; }
  log=$(mktemp)
  if ! timeout 600 "$ENGINE" --gtest_fail_fast >"$log" 2>&1; then
    echo "caught by the engine tests: $(grep -m1 '^\[  FAILED  \]' "$log")"
    grep -m1 -A3 -E 'Failure$' "$log" | sed 's/^/    /'
  elif ! "$CHECK" "$WORKER" >"$log" 2>&1; then
    echo "caught by the two-rank check (the one-rank tests passed):"
    grep -m3 -E 'FAILED' "$log" | sed 's/^/    /'
  else
    echo "NOT CAUGHT: the engine tests and the two-rank check pass with this mutant"
    missed=1
  fi
  rm -f "$log"
done
[ $missed = 0 ] && echo "every mutant caught" || echo "FAILED: some mutant was not caught"
exit $missed
