#!/usr/bin/env bash
# The CUDA backend holds the device code of every target of -Dgpu_targets (machine code for each
# sm_NN, PTX for each compute_NN; the default: sm_80 and sm_90, PTX for newer GPUs) and every kernel
# of kernels/cuda/powersgd_kernels.h. Exit 77 (meson: skipped) where cuobjdump is missing.
#   check_device_code.sh LIB [ARCHS]   (ARCHS: meson's gpu_targets, default sm_80,sm_90,compute_90)
set -u
lib=$1 archs=${2:-sm_80,sm_90,compute_90}
command -v cuobjdump >/dev/null || { echo "cuobjdump not found: skipped"; exit 77; }
elf=$(cuobjdump -lelf "$lib") || { echo "cuobjdump failed on $lib"; exit 1; }
ptx=$(cuobjdump -lptx "$lib")
syms=$(cuobjdump -symbols "$lib")
fail=0
for a in ${archs//,/ }; do
  case $a in
    sm_*) grep -q "$a" <<<"$elf" || { echo "no $a machine code"; fail=1; } ;;
    compute_*) grep -q "sm_${a#compute_}" <<<"$ptx" || { echo "no PTX for $a (newer GPUs)"; fail=1; } ;;
  esac
done
for k in pass1Kernel pass2Kernel pass3Kernel orthoKernel packKernel unpackKernel; do
  grep -q "$k" <<<"$syms" || { echo "kernel $k missing"; fail=1; }
done
n=$(grep -c 'STT_FUNC.*STO_ENTRY\|FUNC .*ENTRY' <<<"$syms")
echo "$n kernel entries in $(basename "$lib")"
exit $fail
