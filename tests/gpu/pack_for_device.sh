#!/usr/bin/env bash
# Builds the CUDA configuration here (CPU machine with the CUDA toolkit) into build-device/ and
# copies in the shared libraries a bare GPU machine lacks (UCX and its modules, libnuma) and pytest
# for the Python tests (build-device/device-py), so that
# run_device_checks.sh can run there without a package manager. CUDA, cuBLAS and NCCL are not
# copied: the GPU machine has its own (NCCL from PyTorch's wheel there).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${LOWRANK_BUILD_DIR:-build-device}
[ -f "$B/build.ninja" ] || meson setup "$B" . -Dcuda=enabled -Dbuildtype=release >/dev/null
ninja -C "$B" >/dev/null
L="$B/device-libs"
rm -rf "$L"; mkdir -p "$L/ucx"
for lib in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0 libucs_signal.so.0 libnuma.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$L/"
done
cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$L/ucx/" 2>/dev/null || true
# pytest (pure Python) for tests/python/test_cuda.py: the GPU machine reaches no package registry.
P="$B/device-py"
rm -rf "$P"; mkdir -p "$P/wheels"
if python3 -m pip download -q --disable-pip-version-check --no-deps -d "$P/wheels" \
     pytest pluggy iniconfig packaging >/dev/null 2>&1; then
  for w in "$P"/wheels/*.whl; do python3 -m zipfile -e "$w" "$P/site"; done
  rm -rf "$P/wheels"
else
  echo "pack: pytest not packed (PyPI unreachable): the Python hook's CUDA tests will not run there"
fi
du -sh "$B" | awk '{print "packed " $2 ": " $1}'
