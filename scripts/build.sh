#!/usr/bin/env bash
# Sets up what is missing and builds into build/ (or $LOWRANK_BUILD_DIR). Extra arguments go to
# `meson setup` on the first configure, e.g. -Dcuda=enabled.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LOWRANK_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" "$@"
fi
ninja -C "$build"
