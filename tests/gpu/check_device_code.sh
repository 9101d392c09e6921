#!/usr/bin/env bash
# The CUDA backend holds machine code for sm_80 and sm_90, PTX for newer GPUs, and every kernel of
# kernels/cuda/powersgd_kernels.h. Exit 77 (meson: skipped) where cuobjdump is missing.
set -u
lib=$1
command -v cuobjdump >/dev/null || { echo "cuobjdump not found: skipped"; exit 77; }
elf=$(cuobjdump -lelf "$lib") || { echo "cuobjdump failed on $lib"; exit 1; }
ptx=$(cuobjdump -lptx "$lib")
syms=$(cuobjdump -symbols "$lib")
fail=0
for a in sm_80 sm_90; do grep -q "$a" <<<"$elf" || { echo "no $a machine code"; fail=1; }; done
grep -q "sm_90" <<<"$ptx" || { echo "no PTX for newer GPUs"; fail=1; }
for k in pass1Kernel pass2Kernel pass3Kernel orthoKernel packKernel unpackKernel; do
  grep -q "$k" <<<"$syms" || { echo "kernel $k missing"; fail=1; }
done
n=$(grep -c 'STT_FUNC.*STO_ENTRY\|FUNC .*ENTRY' <<<"$syms")
echo "$n kernel entries in $(basename "$lib")"
exit $fail
