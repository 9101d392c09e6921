#!/usr/bin/env bash
# The main job: sets up, builds, and runs the perf binary on real gradients (a small CNN trained on
# scikit-learn's digits, perf/data/digits_cnn) with 4 comm ranks as threads: exact allreduce, fp16
# and PowerSGD at k = 4, then PowerSGD against exact over a range of sizes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LOWRANK_BUILD_DIR:-$root/build}
# Only what the demo runs (the perf binary and liblowrank): scripts/test.sh builds the rest.
"$root/scripts/build.sh" -- perf/lowrank_allreduce_perf
perf="$build/perf/lowrank_allreduce_perf"
echo
echo "== Real gradients: perf/data/digits_cnn step0040, 4 ranks, k = 4, 10 rounds =="
"$perf" -t 4 --gradients "$root/perf/data/digits_cnn" --step step0040 -k 4 --rounds 10 \
  --mode exact,fp16,powersgd -n 10 -w 2
echo
echo "== Synthetic gradients (decaying spectrum), 4 ranks, 64 KB .. 16 MB =="
"$perf" -t 4 -b 64K -e 16M -f 4 -k 4 --mode exact,powersgd -n 5 -w 1 -c 0
