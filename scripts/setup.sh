#!/usr/bin/env bash
# Installs the Debian packages lowrank needs to build, only those missing. With --test, also what
# the multi-process tests use: iproute2 (network namespaces as hosts) and Open MPI's mpirun.
set -euo pipefail
pkgs=(g++ meson ninja-build pkg-config python3 libucx-dev libgtest-dev libeigen3-dev nlohmann-json3-dev)
[ "${1:-}" = "--test" ] && pkgs+=(iproute2 openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
