#!/usr/bin/env python3
"""Mutants of the CUDA backend (plugin/engine/cuda: the schedule, the device state, and the entry
points of backend.cc): bugs a GPU would show, each one edit of a copy of one source file, built
into its own emulated CUDA backend (tests/gpu/emu/meson.build). run_mutants.sh checks that the
emulated engine tests fail on every one.

  mutants.py list                   one line per mutant: its name and the file it edits
  mutants.py make NAME OUTDIR SOURCE   writes OUTDIR/NAME_<file>: SOURCE with NAME's edit
  mutants.py describe NAME           what the mutant breaks

An edit whose text is not found exactly once fails the build: the schedule changed, and the
mutant must be brought up to date with it.
"""
import os
import sys

# name: (file, what it breaks, text, replacement)
MUTANTS = {
    "no_wait_for_q_allreduce": (
        "device_schedule.cc",
        "missing event wait: pass 3 (compute stream) does not wait for its Q chunk's allreduce "
        "(communication stream)",
        "    LR_CUDA(cudaStreamWaitEvent(s, ch.reduced, 0));\n",
        ""),
    "allreduce_before_compute": (
        "device_schedule.cc",
        "missing event wait: the factor allreduces (communication stream) do not wait for the "
        "chunk computed on the compute stream",
        "  LR_CUDA(cudaStreamWaitEvent(dc.stream, ready, 0));\n",
        ""),
    "residual_never_written": (
        "device_state.cc",
        "read of never-written device memory: the residual E is not zeroed when allocated",
        "    if (e) LR_CUDA(cudaMemset(e, 0, pl.count * sizeof(float)));\n",
        ""),
    "fresh_q_dropped": (
        "device_schedule.cc",
        "the initial Q that liblowrank draws on the host never reaches the device: the first call "
        "orthonormalizes the zeroed Qt as if it were a warm start",
        "  if (!freshQ) {\n",
        "  if (true) {\n"),
    "decompress_on_comm_stream": (
        "device_schedule.cc",
        "kernel on the wrong stream: decompress + error update (pass 3) launched on the "
        "communication stream instead of the caller's",
        "recv, pl.dtype, checks,\n                                     expectedOp, s));",
        "recv, pl.dtype, checks,\n                                     expectedOp, dc.stream));"),
    # Caught by test_cuda_tensor_ids.cc (one rank) and two_rank_worker's tensorIds (two), whose
    # calls are queued unsynchronized on two streams while their state moves between buffers.
    "no_wait_for_last_call": (
        "backend.cc",
        "missing event wait: a compressed call on another stream than the state's last call does "
        "not wait for it (the same ids at a new address on another stream, FSDP's case)",
        "    LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));  // the buffer's last call, on whatever "
        "stream\n",
        ""),
    "save_before_last_call": (
        "backend.cc",
        "checkpoint copy too early: stateSave copies the residual and Q to the host without "
        "waiting for the state's last call (a regrouping's copy of each id's state, a save after "
        "queued calls)",
        "    LR_TRY(waitDevice(*b.comm, b.done, nullptr, \"the state's last call (checkpoint save)\"));\n"
        "    if (residual && b.e)\n      LR_CUDA(cudaMemcpy(residual, b.e,",
        "    if (residual && b.e)\n      LR_CUDA(cudaMemcpy(residual, b.e,"),
}


def make(name, outdir, src):
    target, _, old, new = MUTANTS[name]
    if os.path.basename(src) != target:
        sys.exit(f"mutant {name} edits {target}, not {src}")
    text = open(src).read()
    if text.count(old) != 1:
        sys.exit(f"mutant {name}: {old.strip()!r} occurs {text.count(old)} times in {src}, "
                 "not once: update tests/gpu/emu/mutants.py to the schedule")
    with open(os.path.join(outdir, f"{name}_{target}"), "w") as f:
        f.write(text.replace(old, new))


def main(argv):
    if argv[1:2] == ["list"]:
        print("\n".join(f"{name} {m[0]}" for name, m in MUTANTS.items()))
    elif argv[1:2] == ["describe"] and len(argv) == 3:
        print(MUTANTS[argv[2]][1])
    elif argv[1:2] == ["make"] and len(argv) == 5:
        make(argv[2], argv[3], argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
