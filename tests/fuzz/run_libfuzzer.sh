#!/usr/bin/env bash
# Open-ended fuzzing of the targets of tests/fuzz with clang's libFuzzer (ASan + UBSan), each for
# SECONDS (default 60), starting from the checked-in corpus. New inputs go to build-fuzz/corpus/,
# a crash or broken invariant to build-fuzz/artifacts/ (replay one with the CI build:
# build/tests/fuzz/fuzz_TARGET FILE). Worth adding to tests/fuzz/corpus/TARGET: the inputs that
# found a bug, once it is fixed.
#   tests/fuzz/run_libfuzzer.sh [SECONDS] [TARGET...]      (targets: plan policy config bootstrap restore)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}; shift || true
targets=${*:-plan policy config bootstrap restore}
B=build-fuzz
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install clang)"; exit 2; }
[ -f "$B/build.ninja" ] || CC=clang CXX=clang++ meson setup "$B" . -Dlibfuzzer=true -Dcuda=disabled \
  -Dbuildtype=debugoptimized >/dev/null
for t in $targets; do ninja -C "$B" "tests/fuzz/fuzz_$t" >/dev/null; done
mkdir -p "$B/artifacts"
fail=0
for t in $targets; do
  mkdir -p "$B/corpus/$t"
  echo "== fuzz_$t: ${secs} s"
  LOWRANK_DEBUG=NONE LOWRANK_SOCKET_IFNAME=lo ASAN_OPTIONS=detect_leaks=1 \
    "$B/tests/fuzz/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$B/artifacts/${t}-" "$B/corpus/$t" "tests/fuzz/corpus/$t" 2>&1 |
    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|^==[0-9]+==ERROR|invariant broken|^SUMMARY" || true
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzz_$t FAILED: see $B/artifacts"; fail=1; }
done
exit $fail
