#!/usr/bin/env bash
# Makes a venv with PyPI's torch 2.x (what most users run), numpy, pytest and scipy (the studies'
# statistics, studies/lib/stats.py), for the second run of tests/python and the studies' tests; prints its python's path on the last line. Idempotent: an existing venv whose torch
# imports is kept. Usage: scripts/setup_torch2.sh [DIR] (default: .venv-torch2 in the repository).
# Cost, seen on a 2-core machine: about 4.7 GB on disk (torch pulls NVIDIA's CUDA libraries from
# PyPI; they load without a GPU), 1 to 3 minutes with a warm network.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.venv-torch2}
torch_version=${LOWRANK_TORCH2_VERSION:-2.15.0}
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import torch, numpy, pytest, scipy' 2>/dev/null; then
  echo "setup_torch2: $dir has torch $("$dir/bin/python" -c 'import torch; print(torch.__version__)')" >&2
else
  start=$(date +%s)
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "torch==$torch_version" numpy pytest scipy >&2
  echo "setup_torch2: torch $torch_version installed in $dir in $(( $(date +%s) - start )) s" >&2
fi
echo "$dir/bin/python"
