#!/usr/bin/env bash
# Packs what run_device_checks.sh needs on a GPU machine into PACK_DIR (default build-device/),
# from an existing CUDA build here (BUILD_DIR: default $LOWRANK_BUILD_DIR, else build/), which it
# reuses: ninja brings only the targets below up to date there (nothing when they are); a build
# folder is configured afresh only when there is none. Copied with the build's own layout, so that
# their $ORIGIN-relative run paths still hold: liblowrank, the CUDA backend, the NCCL shim, the
# device tests, the two-rank worker and the kernel perf (about 20 MB with -Dgpu_targets=sm_80);
# plus the shared libraries a bare GPU machine lacks (UCX and its modules, libnuma:
# PACK_DIR/device-libs) and pytest for the Python tests (PACK_DIR/device-py, kept from an earlier
# pack). CUDA, cuBLAS and NCCL are not copied: the GPU machine has its own (NCCL from PyTorch's
# wheel there). Carry PACK_DIR and the checkout; there, tests/gpu/run_device_checks.sh PACK_DIR.
#   tests/gpu/pack_for_device.sh [BUILD_DIR [PACK_DIR]]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-${LOWRANK_BUILD_DIR:-build}}
P=${2:-build-device}
FILES="liblowrank.so liblowrank.so.0 plugin/cuda_backend/liblowrank_cuda.so
  plugin/nccl_shim/liblowrank_nccl.so tests/gpu/test_cuda_kernels tests/gpu/test_cuda_engine
  tests/gpu/two_rank_worker perf/cuda/lowrank_cuda_kernel_perf"
if [ ! -f "$B/build.ninja" ]; then
  echo "pack: no build at $B: configuring one (-Dcuda=enabled, release)"
  meson setup "$B" . -Dcuda=enabled -Dbuildtype=release >/dev/null
fi
grep -q 'liblowrank_cuda\.so' "$B/build.ninja" ||
  { echo "pack: $B is not a CUDA build (meson configure $B -Dcuda=enabled)"; exit 2; }
# Only what the checks run (meson's target names).
meson compile -C "$B" lowrank lowrank_cuda lowrank_nccl test_cuda_kernels test_cuda_engine \
  two_rank_worker lowrank_cuda_kernel_perf | tail -1
[ "$(realpath "$P")" != "$(realpath "$B")" ] || { echo "pack: PACK_DIR must not be the build"; exit 2; }
mkdir -p "$P"
rm -rf "$P/plugin" "$P/tests" "$P/perf" "$P/device-libs" "$P"/liblowrank.so*
for f in $FILES; do
  mkdir -p "$P/$(dirname "$f")"
  cp -L "$B/$f" "$P/$f"  # plain files: a copy that drops symbolic links still works
done
L="$P/device-libs"
mkdir -p "$L/ucx"
for lib in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0 libucs_signal.so.0 libnuma.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$L/"
done
cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$L/ucx/" 2>/dev/null || true
# pytest (pure Python) for tests/python/test_cuda.py: the GPU machine reaches no package registry.
D="$P/device-py"
if [ ! -d "$D/site/pytest" ]; then
  rm -rf "$D"; mkdir -p "$D/wheels"
  if timeout 120 python3 -m pip download -q --disable-pip-version-check --no-deps -d "$D/wheels" \
       pytest pluggy iniconfig packaging >/dev/null 2>&1; then
    for w in "$D"/wheels/*.whl; do python3 -m zipfile -e "$w" "$D/site"; done
  else
    echo "pack: pytest not packed (PyPI unreachable): the Python hook's CUDA tests will not run there"
  fi
  rm -rf "$D/wheels"
fi
du -sh "$P" | awk '{print "packed " $2 " from '"$B"': " $1}'
