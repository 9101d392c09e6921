#!/usr/bin/env bash
# Instructions (Ir) of one compressed lowrankAllReduce call, counted by valgrind's callgrind: a
# measure of the engine's CPU cost that, unlike time, is the same from run to run, so that two
# builds (before and after an engine change) can be compared on a shared 2-core machine.
#   studies/ab/callgrind_call.sh BUILD_DIR [ITERS [PERF_OPTION...]]
# PERF_OPTIONs are added to the perf's command line, e.g. `--ids` (the tensors declared with ids)
# or `--ids --move` (recvbuff at a new address every call, the ids declared on it each call):
#   studies/ab/callgrind_call.sh build 3 --ids --move
# Workload: lowrank_allreduce_perf, world 1 (one thread), ResNet-50's 161 tensors (studies/lib/gradsets.py
# resnet50, one synthetic gradient file, made once under $LOWRANK_GRADSETS, default
# /tmp/lowrank-gradsets; needs numpy), per-tensor layout, k 4, the library's defaults otherwise.
# How: callgrind dumps a profile part after every return from lowrankAllReduce
# (--dump-after=lowrankAllReduce), so each part holds what the process executed, all threads,
# since the previous call returned. With -w 0 the perf's timed out-of-place loop calls back to back:
# part 1 is start-up and the perf's exact float64 reference call, part 2 the first compressed call
# (it plans the buffer), parts 3 .. ITERS+1 are steady calls and nothing else. Printed per steady
# call: the part's total Ir, and the self Ir of liblowrank.so's functions in it
# (callgrind_annotate --inclusive=no --threshold=100, the lines whose object is liblowrank; the
# rest is libc's memset/memcpy called by the library, and the frames open on the stack at the dump).
# Takes about a minute on 2 cores (the rest of the perf's run, in-place loop and relerr_opt, too).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] ||
  { echo "usage: $0 BUILD_DIR [ITERS (>= 2, default 3) [PERF_OPTION...]]" >&2; exit 2; }
build=$(cd "$1" && pwd)
iters=${2:-3}
shift $(($# >= 2 ? 2 : 1))
perf=$build/perf/lowrank_allreduce_perf
grads=${LOWRANK_GRADSETS:-/tmp/lowrank-gradsets}/resnet50_w1
[ -f "$grads/synth_worker0.safetensors" ] || /usr/bin/python3 "$root/studies/lib/gradsets.py" resnet50 "$grads" 1 >&2
for v in $(env | grep -oE '^LOWRANK_[A-Z0-9_]+=' | tr -d =); do unset "$v"; done  # defaults only
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" valgrind --tool=callgrind \
  --dump-after=lowrankAllReduce --callgrind-out-file="$tmp/cg" "$perf" -t 1 --gradients "$grads" \
  -k 4 -w 0 -n "$iters" --rounds 1 --phases 0 --triad-mib 0 "$@" > "$tmp/perf.log" 2> "$tmp/valgrind.log" ||
  { tail -5 "$tmp/valgrind.log" "$tmp/perf.log" >&2; exit 1; }
echo "# $perf${*:+ $*}: ResNet-50 shapes, world 1, per-tensor, k 4; Ir per steady compressed call"
for ((p = 3; p <= iters + 1; ++p)); do
  total=$(sed -n 's/^summary: //p' "$tmp/cg.$p")
  lib=$(callgrind_annotate --inclusive=no --threshold=100 "$tmp/cg.$p" |
        awk '/liblowrank\.so/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
  echo "call $((p - 1)): Ir $total, in liblowrank.so (self) $lib"
done
