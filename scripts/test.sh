#!/usr/bin/env bash
# Sets up, builds and runs every test (meson test), then prints one line "N passed, M failed"
# counting GoogleTest cases one by one and the other tests as one each. Exit status 0 only if none
# failed. Arguments go to meson test: `scripts/test.sh --no-suite studies` is the library's quick
# loop, without the studies' tests (tests/studies, suite studies; .ci/run runs them).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LOWRANK_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" --test || { echo "0 passed, 1 failed (setup)"; exit 1; }
# LOWRANK_MESON_ARGS: options for the first configure (CI sets -Dcuda=enabled).
# shellcheck disable=SC2086
"$root/scripts/build.sh" ${LOWRANK_MESON_ARGS:-} || { echo "0 passed, 1 failed (build)"; exit 1; }
# The tests set the LOWRANK_* and UCX variables they need: any left in the caller's shell (a
# LOWRANK_APPROX_RANK from an experiment) would change what they check. Say so, and drop them.
stray=$(env | grep -oE '^(LOWRANK_[A-Z0-9_]+|UCX_TLS|UCX_NET_DEVICES)=' | tr -d = | grep -vxE 'LOWRANK_BUILD_DIR|LOWRANK_MESON_ARGS' || true)
if [ -n "$stray" ]; then
  echo "test.sh: ignoring $(echo $stray | tr ' ' ',') from the environment for the tests"
  for v in $stray; do unset "$v"; done
fi
rm -rf "$build/tests/reports" "$build/meson-logs/testlog.json"
mkdir -p "$build/tests/reports"
meson test -C "$build" --print-errorlogs --num-processes 1 "$@"
rc=$?
python3 "$root/scripts/count_tests.py" "$build" || rc=1
exit $rc
