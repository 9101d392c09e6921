#!/usr/bin/env bash
# compute-sanitizer TOOL (racecheck, synccheck) on the pass and orthonormalization kernel tests,
# for run_device_checks.sh. Exit 0: clean; 3: the sanitizer found hazards, or a test failed
# (lowrank's failure); 77: the machine refuses the sanitizer (not installed; unsupported GPU,
# driver, container or MIG set-up: the tool's own error before the tests ran), which the script
# reports as "not available", not as lowrank's failure; other: as the tool exits.
#   sanitize_kernels.sh TOOL KERNEL_TEST_BINARY
set -u
tool=$1 bin=$2
san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
[ -x "$san" ] || { echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin)"; exit 77; }
log=$(mktemp)
"$san" --tool "$tool" --error-exitcode 3 "$bin" \
  --gtest_filter='*Pass1*:*Pass2*:*Pass3*:*Orthonormalize*' >"$log" 2>&1
rc=$?
cat "$log"
# The tests ran (gtest's closing line) or failed: the result is lowrank's.
if [ $rc != 0 ] && ! grep -qE '^\[(==========|  FAILED  )\]' "$log" &&
   grep -qiE 'not supported|unsupported|Internal Sanitizer Error|debugger|injection|permission|unable to (attach|initialize|load|find)|CUDA_ERROR_NOT_|no CUDA-capable device' "$log"; then
  echo "compute-sanitizer $tool: refused by this machine (its own error above, before any test ran)"
  rm -f "$log"
  exit 77
fi
rm -f "$log"
exit $rc
