"""What a step of PowerSGDState runs: each device's communicator and worker (Runtime, a mixin of
hook.py's PowerSGDState), a bucket's job (on the worker, or a side stream for CUDA), an adaptive
rank's measurements inside it, and the end of a step."""
import contextlib
import functools
import logging

import torch

from ..errors import LowrankError
from .memory import use_torch_memory
from .process_group import communicator_from_process_group
from .signals import accumulate, measure, take_norms
from .worker import Worker

logger = logging.getLogger("lowrank.torch")


class Runtime:
    """The communicators, worker threads and side streams, and the end of a step."""

    def _comm(self, device):
        """The communicator of `device` for the hook's jobs (made at the first call, a CUDA
        one on that device; with an adaptive rank, one whose allreduce also measures the buckets
        _declare asked for)."""
        self._check_open("powerSGD_hook")
        device = comm_key(device)
        if device not in self._comms:
            on = torch.cuda.device(device) if device != "cpu" else contextlib.nullcontext()
            with on:  # lowrank's NCCL communicator is made on the current device
                self._comms[device] = communicator_from_process_group(
                    self.process_group, device_kind(device), **self._config)
            if device != "cpu":  # its buckets' state in torch's memory (memory.py)
                use_torch_memory(self._comms[device], device)
            self._workers[device] = Worker(f"lowrank-{device}")
        if self._adaptive is not None:
            return Measured(self, device, self._comms[device])
        return self._comms[device]

    def _side_stream(self, device, index):
        """The CUDA stream bucket `index`'s calls are queued on (one per bucket, so that a
        bucket's pass 1 does not wait behind the previous bucket's join)."""
        key = (str(device), index)
        if key not in self._side_streams:
            self._side_streams[key] = torch.cuda.Stream(device)
        return self._side_streams[key]

    def _end_of_step(self):
        """After the last bucket's job: release, on each device's worker, the buffers of buckets
        DDP no longer has (their ids went to this step's buffers) and the scratch buffers of a
        load (dropping what no bucket took, with a warning)."""
        live = {(b.device, b.ptr) for b in self._step.values()}
        stale = {(b.device, b.ptr): b.buf for b in self._buckets.values()
                 if (b.device, b.ptr) not in live}
        stale.update({(dev, t.data_ptr()): t for dev, t in self._scratch})
        if self._ident_rank and not self._warned_unmatched:
            self._warned_unmatched = True
            lost = set(self._ident_rank) - set(self._param_pos)
            if lost:
                names = self._ranks.names()
                logger.warning("lowrank: exclude or rank_of names %d parameters that no bucket "
                               "holds (frozen, not in this DDP model, or moved since): %s",
                               len(lost), ", ".join(sorted(names.get(i, f"shape {i[3]}")
                                                           for i in lost)[:10]))
        if self._unclaimed:
            ids = sorted(self._unclaimed)
            logger.warning("lowrank: the saved states of %d tensors were not used by the first "
                           "step after loading (no bucket has those parameters: another model or "
                           "other DDP arguments?); those parameters started afresh. Unused ids: "
                           "%s%s", len(ids), ", ".join(str(i) for i in ids[:20]),
                           f", ... ({len(ids)} in all)" if len(ids) > 20 else "")
        self._buckets, self._step, self._scratch = self._step, {}, []
        self._loaded, self._expect, self._unclaimed = None, {}, set()
        for dev in {dev for dev, _ in stale}:
            comm = self._comms[dev]
            bufs = [(ptr, buf) for (d, ptr), buf in stale.items() if d == dev]
            self._workers[dev].submit(functools.partial(release, comm, bufs))


class Measured:
    """A communicator as a hook's job uses it under an adaptive rank: its allreduce, then, for
    a bucket the state asked for in this step, the numbers the rule needs (signals.measure),
    inside the job: before DDP can write the next step's gradients into the bucket."""

    def __init__(self, state, device, comm):
        self._state, self._device, self._comm = state, device, comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def allreduce(self, buf, *args, **kwargs):
        out = self._comm.allreduce(buf, *args, **kwargs)
        plan = self._state._measure.pop((self._device, buf.data_ptr()), None)
        if plan is not None:
            step, ids, shapes, ruled, last = plan
            sums = self._state._window_sums
            accumulate(sums, buf, ids, shapes, keep=ruled)
            if last and ruled:
                norms = take_norms(sums, ruled)
                try:
                    got = measure(self._comm, buf, ids, shapes)
                except LowrankError:  # no state to read (a dtype lowrank does not compress):
                    got = {}          # the same on every rank, so left out everywhere
                # the gradient norm the rule compares: the window's, not this step's alone
                got = {i: (norms[i], e, m) for i, (_, e, m) in got.items() if i in ruled}
                self._state._signals.setdefault(step, {}).update(got)
        return out


def comm_key(device):
    """The key of a device's communicator: "cpu", or "cuda:N" (one per CUDA device; "cuda" and
    torch.device("cuda") are the current device). ValueError for any other device."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        d = None
    if d is None or d.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    if d.type == "cpu":
        return "cpu"
    return f"cuda:{torch.cuda.current_device() if d.index is None else d.index}"


def device_kind(key):
    """"cpu" or "cuda": a communicator key's kind of device (what a state_dict records)."""
    return key.split(":")[0]


def release(comm, bufs):
    """A worker job: release the buffers (held until now, so no other buffer took the address)."""
    for ptr, _ in bufs:
        try:
            comm.release(ptr)
        except LowrankError as e:  # a failed communicator: the next call says so
            logger.debug("lowrank: release of %#x: %s", ptr, e)


def reduce(comm, decl, setup, buf, stream):
    """One bucket's stagings (restores), declaration and allreduce; returns buf."""
    errors = []  # stagings that failed (raised after the allreduce, which every rank runs)
    for act in setup:
        act(errors)
    try:
        comm.set_tensors(buf, decl.array)
        comm.allreduce(buf, op="avg", stream=stream)
    except LowrankError as e:
        if errors:  # this rank's restore failed: the cause of the others' failure too
            raise errors[0] from e
        raise
    if errors:
        raise errors[0]
    return buf


def reduce_cuda(state, index, comm, decl, setup, buf):
    """A CUDA bucket, on the autograd thread: lowrank's call only queues device work, so it runs
    here, in DDP's bucket order, and every rank issues lowrank's NCCL collectives in the same order
    relative to the process group's own (SyncBatchNorm, the unused-parameter allreduce), which NCCL
    requires of two communicators on one device (docs/pytorch.md). The call is queued on a side
    stream of the bucket's that first waits for the current stream (the gradients); lowrank forks
    its own streams from it and joins it at the end, so the current stream (the rest of backward)
    never waits for lowrank's communication: the future, completed on the side stream, carries
    that dependency to DDP's wait at the end of backward."""
    side = state._side_stream(buf.device, index)
    side.wait_stream(torch.cuda.current_stream(buf.device))
    fut = torch.futures.Future(devices=[buf.device])
    with torch.cuda.device(buf.device), torch.cuda.stream(side):
        try:
            result = reduce(comm, decl, setup, buf, side)
        except BaseException as e:  # noqa: B902 - every failure goes to the future
            fut.set_exception(e)
            return fut
        buf.record_stream(side)
        fut.set_result(result)  # records its event on the side stream (current here)
    return fut


def log_stats(state):
    if state.iter < state.next_stats_report or not logger.isEnabledFor(logging.INFO):
        return
    rate, before, after = state.compression_stats()
    logger.info("lowrank: step %d, compression rate %.1f, %d elements before, %d after",
                state.iter, rate, before, after)
    state.next_stats_report = state.iter + state.compression_stats_logging_frequency
