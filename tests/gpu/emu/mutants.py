#!/usr/bin/env python3
"""Mutants of the CUDA backend (plugin/cuda_backend: the schedule, the device state, and the entry
points of backend.cc): bugs a GPU would show, each one edit of a copy of one source file, built
into its own emulated CUDA backend (tests/gpu/emu/meson.build). run_mutants.sh checks that the
emulated engine tests fail on every one.

  mutants.py list                   one line per mutant: its name and the file it edits
  mutants.py make NAME OUTDIR SOURCE   writes OUTDIR/NAME_<file>: SOURCE with NAME's edit
  mutants.py describe NAME           what the mutant breaks
  mutants.py first NAME              the check to try first ("two-rank", or a gtest filter)

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
        "    if (e) LR_CUDA(cudaMemsetAsync(e, 0, pl.count * sizeof(float), compute));\n",
        ""),
    "tables_not_ordered": (
        "device_state.cc",
        "set-up racing the first call (without memory pools, the fallback): the buffer's "
        "non-blocking stream does not wait for the launch tables' synchronous copies from pageable "
        "memory (legacy default stream)",
        "      LR_CUDA(cudaEventRecord(forked, nullptr));\n"
        "      LR_CUDA(cudaStreamWaitEvent(compute, forked, 0));\n",
        "      LR_CUDA(cudaEventRecord(forked, nullptr));\n"),
    # Issue 39: no synchronizing call on the training path, and one deadline for an abort.
    "free_synchronous": (
        "device_state.cc",
        "a released buffer (a rebucketing) frees its device memory with cudaFree, which waits "
        "for the whole device (behind NCCL's kernels) instead of cudaFreeAsync on its stream",
        "    else if (on) cudaFreeAsync(p, on);\n    else cudaFree(p);\n",
        "    else cudaFree(p);\n"),
    "tables_synchronous": (
        "device_state.cc",
        "a buffer planned during training uploads its exact part's launch table by cudaMalloc and "
        "a pageable cudaMemcpy (legacy default stream) instead of stream-ordered on its stream",
        "createExactTable(exacts.data(), exacts.size(), &exact, on, &mem)",
        "createExactTable(exacts.data(), exacts.size(), &exact, nullptr, &mem)"),
    "pinned_per_buffer": (
        "device_state.cc",
        "a buffer planned during training allocates its pinned check slots with cudaMallocHost "
        "(which synchronizes the device) instead of taking them from the communicator's pool",
        "    LR_TRY(dc.pinned.take(kCheckSlots * 2 * sizeof(float), &checks, &pinnedBytes));\n",
        "    LR_CUDA(cudaMallocHost(&checks, kCheckSlots * 2 * sizeof(float)));\n"),
    "plan_check_breaks_capture": (
        "backend.cc",
        "the plan check polls its collective (cudaStreamQuery) in the caller's capture mode: a "
        "hook thread planning a buffer breaks another thread's CUDA graph capture (global mode)",
        "int planCheck(lowrankCudaComm_t* c, uint64_t* words, lowrankCudaError_t* error) {\n"
        "  const RelaxedCaptureMode relaxed;",
        "int planCheck(lowrankCudaComm_t* c, uint64_t* words, lowrankCudaError_t* error) {\n"
        "  "),
    "setup_on_legacy_stream": (
        "device_state.cc",
        "a buffer's set-up records an event on the legacy default stream (as before issue 39), "
        "which breaks another thread's capture of a blocking stream and synchronizes with "
        "PyTorch's default stream",
        "    if (!on) {\n",
        "    if (true) {\n"),
    "abort_grace_per_buffer": (
        "device_wait.cc",
        "after an abort each buffer's teardown wait gets a second of its own (issue 39: 32 stuck "
        "buffers took 33 s) instead of one deadline for all",
        "      dc.aborted ? abortDeadline(dc)\n",
        "      dc.aborted ? Clock::now() + std::chrono::seconds(1)\n"),
    "fresh_q_dropped": (
        "device_schedule.cc",
        "the initial Q that liblowrank draws on the host never reaches the device: the first call "
        "orthonormalizes the zeroed Qt as if it were a warm start",
        "  if (!freshQ) {\n",
        "  if (true) {\n"),
    "decompress_on_comm_stream": (
        "device_schedule.cc",
        "kernel on the wrong stream: decompress + error update (pass 3) launched on the "
        "communication stream instead of the buffer's compute stream",
        "recv, dtype, checks,\n                                     expectedOp, s));",
        "recv, dtype, checks,\n                                     expectedOp, dc.stream));"),
    # Caught by the stress of test_cuda_streams_emulated.cc (calls alternating two non-blocking
    # streams, no host synchronization), test_cuda_tensor_ids.cc and two_rank_worker's tensorIds.
    "schedule_on_callers_stream": (
        "backend.cc",
        "the call runs its passes on the caller's stream (as before issue 26), which then waits "
        "for the factor allreduces mid-call: the caller's next kernels wait for lowrank's "
        "communication, and DDP loses its overlap",
        "qStep != 0, b.compute);\n",
        "qStep != 0, s);\n"),
    "no_fork": (
        "backend.cc",
        "missing event wait: the buffer's stream does not wait for the caller's stream, so pass 1 "
        "may read the gradient before the caller's kernels wrote it",
        "    LR_CUDA(cudaStreamWaitEvent(b.compute, b.forked, 0));\n",
        ""),
    "no_join": (
        "backend.cc",
        "missing event wait: the caller's stream does not wait for the end of the call, so its "
        "next kernels read the output before pass 3 wrote it",
        "    LR_CUDA(cudaStreamWaitEvent(s, b.done, 0));\n",
        ""),
    "save_unbounded": (
        "backend.cc",
        "unbounded host wait: the checkpoint save copies to pageable memory without first waiting "
        "(bounded) for the state's last call, so behind a collective that never ends (a dead "
        "peer) the copy blocks the host for good instead of timing out",
        "    LR_TRY(waitDevice(*b.comm, b.done, nullptr, \"the state's last call (checkpoint save)\"));\n",
        ""),
    "restore_off_stream": (
        "backend.cc",
        "restore not ordered before the next call: stateLoad copies the warm-start Q on the legacy "
        "default stream, which the buffer's non-blocking stream is not ordered with",
        "LR_CUDA(cudaMemcpyAsync(b.qt, qt, b.plan.qElems * sizeof(float), cudaMemcpyHostToDevice,\n"
        "                              b.compute));",
        "LR_CUDA(cudaMemcpyAsync(b.qt, qt, b.plan.qElems * sizeof(float), cudaMemcpyHostToDevice,\n"
        "                              nullptr));"),
    "plan_check_pageable": (
        "backend.cc",
        "pageable copy racing a non-blocking stream: the plan words go up by a synchronous copy "
        "from pageable memory, which may return before they land, and NCCL reads them on the "
        "communication stream",
        "    LR_CUDA(cudaMemcpyAsync(dc.planCheck, dc.hostPlanCheck, kBytes, cudaMemcpyHostToDevice, dc.stream));\n",
        "    LR_CUDA(cudaMemcpy(dc.planCheck, words, kBytes, cudaMemcpyHostToDevice));\n"),
    # Issue 41: the device is the NCCL communicator's, not whichever the first call's thread had.
    "device_from_current_thread": (
        "backend.cc",
        "wrong device: the communicator's device side is made on the device current at the first "
        "call (cudaGetDevice) instead of its NCCL communicator's (ncclCommCuDevice)",
        "  Err s = commDevice(*nccl, ncclComm, &dc.device);\n",
        "  Err s = fromCuda(cudaGetDevice(&dc.device), \"cudaGetDevice\");\n"),
    # Issue 41 items 1 and 2: the application's memory, and the bytes reported.
    "refusal_goes_exact": (
        "device_state.cc",
        "a refusal of the supplied allocator (lowrankCommSetAllocator) taken as any failed "
        "allocation: the buffer silently goes exact-only (a WARN) instead of the call failing on "
        "every comm rank with the allocator's error",
        "      e.refused = true;\n",
        ""),
    # Issue 44: alternating PowerSGD's device schedule (device_alternate.cc).
    "alternate_rejected_p_kept": (
        "device_alternate.cc",
        "a rejected P step leaves its reduced P (the allreduced sum of a non-finite input) as the "
        "factor of the next Q step, whose output is then NaN too, instead of the first k unit "
        "vectors",
        "      if (ch.ortho) LR_CUDA(unitFactorIfRejected(ch.ortho, p, checks, expectedOp, s));\n",
        "      (void)ch;\n"),
    "alternate_pbar_not_averaged": (
        "device_alternate.cc",
        "the P step keeps and decompresses the allreduced sum of P, not Pbar = P / N: outputs N "
        "times too large (one comm rank cannot tell)",
        "      LR_CUDA(scale(b.payload + ch.offset, factor, 1.f / float(N), s));\n",
        "      (void)factor;\n"),
    # Issue 45: 16-bit factors on the device.
    "factor_dtype_ignored": (
        "device_schedule.cc",
        "factorDtype ignored on the device: every factor allreduce stays float32 (twice the "
        "bytes, and the outputs not the host engine's with 16-bit factors)",
        "  if (b.plan.factorDtype == lowrankFloat32 || !b.wire16 || hi <= lo) return f;\n",
        "  return f;\n"),
    "workspace_not_reported": (
        "device_state.cc",
        "memory under-reported: lowrankBufferGetMemory leaves out the orthonormalization and "
        "block workspaces (workspaceBytes 0, the total short by them)",
        "    memory.workspace = mem.workspace + scratch16;\n",
        ""),
}

# The check seen to catch each mutant, tried first so that the run does not wait through the whole
# suite (fail-fast stops at the first failure, but a mutant caught late, or only by the two-rank
# check, ran most of it). Only an order: a mutant the hint misses still meets every check.
FIRST = {
    "no_wait_for_q_allreduce": "two-rank",
    "allreduce_before_compute": "two-rank",
    "residual_never_written": "DeviceEngine.ExactOnRankKInput",
    "tables_not_ordered": "DeviceStreams.TwoHundredCallsWithoutMemoryPools*",
    "free_synchronous": "DeviceSyncCalls.NoneOnTheTrainingPathOfADdpShapedRun",
    "tables_synchronous": "DeviceSyncCalls.NoneOnTheTrainingPathOfADdpShapedRun",
    "pinned_per_buffer": "DeviceSyncCalls.NoneOnTheTrainingPathOfADdpShapedRun",
    "plan_check_breaks_capture": "DeviceCapture.PlanningOnAnotherThreadLeavesAGlobalCaptureIntact",
    "setup_on_legacy_stream": "DeviceCapture.PlanningOnAnotherThreadLeavesAGlobalCaptureIntact",
    "abort_grace_per_buffer": "DeviceWaits.AbortWith32StuckBuffersTakesOneDeadlineWithoutMemoryPools",
    "fresh_q_dropped": "DeviceEngine.ExactOnRankKInput",
    "decompress_on_comm_stream": "DeviceCheckpoint.ResumeIsBitIdenticalOnEveryRank",
    "schedule_on_callers_stream": "DeviceEngine.ExactOnRankKInput",
    "no_fork": "DeviceStreams.TwoHundred*",  # in the default order (issue 39)
    "no_join": "DeviceCheckpoint.ResumeIsBitIdenticalOnEveryRank",
    "save_unbounded": "DeviceWaits.SaveThatNeverEnds*",
    "restore_off_stream": "DeviceStreams.*",
    "plan_check_pageable": "DeviceEngine.ExactOnRankKInput",
    "device_from_current_thread": "DeviceEngineTwoDevices.*",
    "refusal_goes_exact": "DeviceMemory.*",
    "workspace_not_reported": "DeviceMemory.*",
    "alternate_rejected_p_kept": "DeviceEngineAlternate.ErrorFeedbackInvariantAndRejectedSteps",
    "alternate_pbar_not_averaged": "two-rank",
    "factor_dtype_ignored": "DeviceFactorDtype.FactorsTravelAsBfloat16",
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
    elif argv[1:2] == ["first"] and len(argv) == 3:
        print(FIRST.get(argv[2], ""))
    elif argv[1:2] == ["make"] and len(argv) == 5:
        make(argv[2], argv[3], argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
