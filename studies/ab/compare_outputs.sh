#!/usr/bin/env bash
# Are two builds of lowrank bit-for-bit the same? Runs the same short workloads with each build's
# lowrank_allreduce_perf --digest (every comm rank's FNV-1a 64 of recvbuff after each call of each
# row) and compares the digest lines. Used to prove that an engine change (tensor ids) changes no
# output bit. Prints one line per case, "same NAME" or "DIFF NAME"; exits 1 on any difference or
# failed run, 2 on bad usage.
#   studies/ab/compare_outputs.sh OLD_BUILD_DIR NEW_BUILD_DIR
#   studies/ab/compare_outputs.sh --old-rev REV NEW_BUILD_DIR    # builds REV's perf binary first
# Both perf binaries need --digest (from commit 895008f on; the reference before tensor ids is
# branch `fixture`). Host buffers only: the device engine's tests (tests/gpu, on the CUDA
# emulation) print no outputs to compare, and need a CUDA build.
# The cases run in well under a minute per build on 2 cores; each is deterministic (the same build
# twice gives the same digests: the chunking and the reduction order do not depend on timing).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() { echo "usage: $0 OLD_BUILD_DIR NEW_BUILD_DIR | $0 --old-rev REV NEW_BUILD_DIR" >&2; exit 2; }
tmp=$(mktemp -d)
cleanup() {
  [ -d "$tmp/src" ] && git -C "$root" worktree remove --force "$tmp/src"
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ "${1:-}" = --old-rev ]; then
  [ $# -eq 3 ] || usage
  # A throwaway worktree of REV, built without tests: only the library and the perf binary.
  echo "building $2 in $tmp/src ..." >&2
  git -C "$root" worktree add --detach -q "$tmp/src" "$2" || exit 2
  { meson setup "$tmp/build" "$tmp/src" -Dcuda=disabled -Dtests=false -Dnccl_shim=disabled &&
    nice -n 19 ninja -C "$tmp/build" perf/lowrank_allreduce_perf; } > "$tmp/build.log" 2>&1 ||
    { tail -20 "$tmp/build.log" >&2; echo "build of $2 failed" >&2; exit 2; }
  old=$tmp/build; new=$3
else
  [ $# -eq 2 ] || usage
  old=$1; new=$2
fi
for b in "$old" "$new"; do
  [ -x "$b/perf/lowrank_allreduce_perf" ] || { echo "no $b/perf/lowrank_allreduce_perf" >&2; exit 2; }
done

# LOWRANK_* left in the caller's shell would change what runs (as in scripts/test.sh).
for v in $(env | grep -oE '^LOWRANK_[A-Z0-9_]+=' | tr -d =); do unset "$v"; done
export LOWRANK_UCX_PROBE=0  # the host algorithm from the given constants, never from timing
# Few calls per row: out-of-place and in-place loops (-w 1 -n 2), then 3 calls from a fresh state.
common=(-k 4 -n 2 -w 1 --rounds 3 --phases 0 --triad-mib 0 --digest)
grads=(--gradients "$root/perf/data/digits_cnn" --step step0040)  # real, per-tensor (18 tensors)
synth=(-b 256K -e 4M -f 4 -c 0)  # synthetic, batched (no layout): 64 Ki .. 1 Mi elements
port=$((20000 + RANDOM % 10000))  # below the ephemeral range (32768-): see studies/lib/ports.py

# digests BUILD WORLD threads|processes ENV ARGS...: the '# digest' lines of one run (exit 1 if it failed)
digests() {
  local build=$1 world=$2 kind=$3 envs=$4 rc=0 pids=() r
  shift 4
  # LD_LIBRARY_PATH: each binary takes its own build's liblowrank even where the caller set one
  local run=(env $envs LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120
             "$build/perf/lowrank_allreduce_perf" "${common[@]}" "$@")  # a case's flags win
  if [ "$kind" = threads ]; then
    "${run[@]}" -t "$world" > "$tmp/out0" 2>&1 || rc=1
  else  # one process per comm rank, joined through LOWRANK_ROOT_ADDR (docs/launching.md)
    for ((r = 0; r < world; ++r)); do
      LOWRANK_RANK=$r LOWRANK_WORLD_SIZE=$world LOWRANK_ROOT_ADDR=127.0.0.1:$port \
        "${run[@]}" > "$tmp/out$r" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=1; done
  fi
  if [ $rc -ne 0 ]; then tail -3 "$tmp/out0" >&2; return 1; fi
  grep '^# digest ' "$tmp/out0"
}

fail=0
# compare NAME WORLD KIND ENV ARGS...
compare() {
  local name=$1 a= b=
  # a fresh root port per run (digests runs in a subshell: the increment is made here)
  port=$((port + 1)); a=$(digests "$old" "${@:2}") &&
    port=$((port + 1)) && b=$(digests "$new" "${@:2}") && [ -n "$a" ] && [ "$a" = "$b" ] &&
    { echo "same $name"; return; }
  echo "DIFF $name"
  fail=1
  diff <(echo "$a") <(echo "$b") | head -4 | sed "s/^/  /" >&2
}

for w in 1 2 4; do
  compare "w${w}_threads_pertensor" $w threads "" "${grads[@]}" -d float,half -o sum,avg
  compare "w${w}_threads_batched" $w threads "" "${synth[@]}" -o sum,avg
done
# The engine's settings a tensor-id change could touch: exact mode beside powersgd, the pipeline
# split into several chunks (digits_cnn is one chunk by default), no pipeline, warm-up calls,
# error feedback and warm start off, k <= 2 (Gram-Schmidt), bfloat16.
compare w4_threads_pertensor_exact_mode 4 threads "" "${grads[@]}" -M powersgd,exact
compare w4_threads_pertensor_chunks 4 threads "LOWRANK_PIPELINE_CHUNK=65536" "${grads[@]}" -o avg
compare w2_threads_pertensor_pipeline0 2 threads "LOWRANK_PIPELINE=0" "${grads[@]}" -o avg
compare w2_threads_pertensor_startiter2 2 threads "LOWRANK_START_ITER=2" "${grads[@]}" -o avg
compare w2_threads_pertensor_noef_nows 2 threads "LOWRANK_ERROR_FEEDBACK=0 LOWRANK_WARM_START=0" \
  "${grads[@]}" -o avg
compare w2_threads_batched_k2_bf16 2 threads "" "${synth[@]}" -k 2 -d bfloat16 -o avg
# The host kernels' paths by k (fused for k = 1..8, one sweep per j beyond) and the alternating
# schedule's P and Q steps (rounds 3: P, Q, P), with and without 16-bit factors on the wire.
compare w2_threads_pertensor_k3 2 threads "" "${grads[@]}" -k 3 -d float,bfloat16 -o avg
compare w2_threads_batched_k12 2 threads "" "${synth[@]}" -k 12 -o sum
compare w4_threads_pertensor_alternate 4 threads "LOWRANK_ALTERNATE=1" "${grads[@]}" -o sum,avg
compare w2_threads_pertensor_alternate_bf16 2 threads "LOWRANK_ALTERNATE=1 LOWRANK_FACTOR_DTYPE=bf16" \
  "${grads[@]}" -k 5 -o avg
compare w2_threads_batched_alternate_k12 2 threads "LOWRANK_ALTERNATE=1" "${synth[@]}" -k 12 -o avg
compare w2_processes_pertensor 2 processes "" "${grads[@]}" -o avg
compare w2_processes_batched 2 processes "" "${synth[@]}" -o avg
exit $fail
