#!/usr/bin/env bash
# Sets up what is missing and builds into build/ (or $LOWRANK_BUILD_DIR). Arguments before `--` go
# to `meson setup` on the first configure (e.g. -Dcuda=enabled); those after it are the ninja
# targets to build (default: all of them, every test included).
#   scripts/build.sh [MESON_OPTION...] [-- TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LOWRANK_BUILD_DIR:-$root/build}
meson_args=() targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do meson_args+=("$1"); shift; done
[ $# -gt 0 ] && shift && targets=("$@")
"$root/scripts/setup.sh"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" "${meson_args[@]}"
elif [ ${#meson_args[@]} -gt 0 ]; then
  echo "build.sh: $build is configured already: ignoring ${meson_args[*]} (meson configure $build" \
       "-D...; ninja targets go after --)" >&2
fi
ninja -C "$build" "${targets[@]}"
