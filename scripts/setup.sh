#!/usr/bin/env bash
# Installs the Debian packages lowrank needs to build, only those missing. With --test, also what
# the multi-process tests use: iproute2 (network namespaces as hosts) and Open MPI's mpirun, and
# what the Python tests use under /usr/bin/python3: Debian's torch (1.13, CPU), numpy, pytest, and
# venv (the wheel's tests make a venv without torch); scipy (1.10) for the studies' statistics.
set -euo pipefail
pkgs=(g++ meson ninja-build pkg-config python3 libucx-dev zlib1g-dev libgtest-dev libeigen3-dev nlohmann-json3-dev)
[ "${1:-}" = "--test" ] && pkgs+=(iproute2 openmpi-bin python3-torch python3-numpy python3-scipy python3-pytest python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

# The CUDA toolkit of some machines lacks cuobjdump, which lists the device kernels of the built
# libraries (tests/gpu): NVIDIA's own from PyPI, the 13.x release nearest the toolkit's nvcc 13.0.
if command -v nvcc >/dev/null && ! command -v cuobjdump >/dev/null; then
  tools=/opt/lowrank-tools/cuobjdump
  if $SUDO python3 -m pip install -q --disable-pip-version-check --target "$tools" \
       nvidia-cuda-cuobjdump==13.2.51 >/dev/null 2>&1; then
    $SUDO ln -sf "$tools/nvidia/cu13/bin/cuobjdump" /usr/local/bin/cuobjdump
    $SUDO chmod +x "$tools/nvidia/cu13/bin/cuobjdump"
    echo "setup: installed cuobjdump from PyPI"
  else
    echo "setup: cuobjdump not installed (PyPI unreachable?); the kernel listing test will skip"
  fi
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
  echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
