# A frozen copy of python/lowrank/torch/hook.py at commit 10b093b, the last hook that keyed its
# state by buffer address and wrote state_dict() version 1 (per-bucket format-1 bytes). The tests
# load it as lowrank.torch._hook_v1 (ckpt_worker.py, CKPT_HOOK=v1) only to write version-1
# checkpoints, which today's hook must still load. Not maintained: do not edit.
"""PowerSGDState and powerSGD_hook: PyTorch's DDP PowerSGD hook, with lowrank doing the work.

The arguments and their defaults are those of PyTorch's
torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState; differences are listed
in each argument's description and in docs/pytorch.md. Method: PowerSGD (Vogels, Karimireddy,
Jaggi, NeurIPS 2019, arXiv 1905.13727), per tensor as PyTorch's hook: each gradient of >= 2
dimensions viewed as (shape[0], -1) and compressed if (n + m) k rate < n m, the rest exact.
"""
import atexit
import contextlib
import logging
import math

import torch
import torch.distributed as dist

from .._buffers import describe
from ..errors import InvalidArgumentError, LowrankError
from .process_group import communicator_from_process_group, require_initialized
from .worker import Worker

logger = logging.getLogger("lowrank.torch")
_live_states = set()  # closed at interpreter exit (held here, so not collected before that)


@atexit.register
def _close_at_exit():
    """Stop the worker threads before the interpreter goes: a daemon thread still completing a
    torch future while Python finalizes aborts the process (seen after a peer died)."""
    for state in list(_live_states):
        try:
            state.close(timeout=5)
        except Exception:  # noqa: BLE001 - nothing to report to at exit
            pass


class PowerSGDState:
    """State of lowrank's PowerSGD hook for one DDP model: the communicators, the step count and
    the record of each bucket's buffer and layout. Construct it on every rank at the same point
    (it makes a lowrank communicator over the process group: a collective).

    Args (PyTorch's names and defaults):
      process_group: the torch.distributed group whose ranks reduce together (None: the default
        group). lowrank makes its own communicator over the same ranks: for CPU buckets a host
        communicator (UCX), for CUDA buckets an NCCL communicator; the group itself carries only
        the set-up, and the exact allreduces of the warm-up steps.
      matrix_approximation_rank (1): the approximation rank k (lowrankConfig_t.approxRank).
        0 turns compression off (every step an exact allreduce by lowrank).
      start_powerSGD_iter (1000): steps done as DDP's exact allreduce (over process_group) before
        compression starts. Unlike PyTorch's, values <= 1 are allowed with error feedback and warm
        start: lowrank keys a bucket's state by its parameters, so when DDP rebuilds its buckets
        a bucket of the same parameters (same order) keeps its state and the others start afresh.
      min_compression_rate (2): a tensor is compressed only if (n + m) k rate < n m.
      use_error_feedback (True), warm_start (True): as PyTorch's.
      orthogonalization_epsilon (0): added to column norms in Gram-Schmidt (lowrank uses it for
        k <= 2; Householder QR above needs none, and a zero column never becomes NaN).
      random_seed (0): seed of the first Q, the same on every rank (lowrank draws it with its own
        generator, so the numbers differ from PyTorch's for the same seed).
      compression_stats_logging_frequency (10000): every so many steps, lowrank's counters are
        logged at INFO on the logger "lowrank.torch".
      batch_tensors_with_same_shape (False): accepted and ignored: lowrank's fused passes take all
        tensors of a bucket at once whatever their shapes.
    lowrank's own (keywords only):
      timeout: seconds any wait for a peer may last (LOWRANK_TIMEOUT; default 300); a dead peer
        makes every rank's backward raise within it.
      pipeline: overlap factor allreduces with compression (LOWRANK_PIPELINE; default on).
      device: "cpu" or "cuda", the communicator to make now (default: "cuda" for an NCCL group,
        else "cpu"); a bucket on the other device makes the other one at its first step.
    Raises LowrankError if torch.distributed is not initialized or lowrank cannot start.
    Thread safety: one state serves one DDP model; its hook is called by DDP's autograd thread.

    Checkpoint (docs/pytorch.md, "Checkpoint"): state_dict() / load_state_dict(sd), or pickling
    the state (torch.save(state)); every rank saves and loads its own, with the model and the
    optimizer."""

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0,
                 compression_stats_logging_frequency=10_000, batch_tensors_with_same_shape=False,
                 *, timeout=None, pipeline=None, device=None):
        require_initialized()
        self._set_settings(process_group, dict(
            matrix_approximation_rank=matrix_approximation_rank,
            start_powerSGD_iter=start_powerSGD_iter, min_compression_rate=min_compression_rate,
            use_error_feedback=use_error_feedback, warm_start=warm_start,
            orthogonalization_epsilon=orthogonalization_epsilon, random_seed=random_seed,
            compression_stats_logging_frequency=compression_stats_logging_frequency,
            batch_tensors_with_same_shape=batch_tensors_with_same_shape,
            timeout=timeout, pipeline=pipeline))
        if device is None:
            backend = str(dist.get_backend(process_group)).lower()
            device = "cuda" if backend == "nccl" else "cpu"
        self._comm(device)

    def _set_settings(self, process_group, kw):
        """The arguments of __init__ (kw: by name) and an empty runtime: no communicator yet."""
        if kw["start_powerSGD_iter"] < 0:
            raise ValueError(f"start_powerSGD_iter must be >= 0, not {kw['start_powerSGD_iter']}")
        self.process_group = process_group
        self.matrix_approximation_rank = kw["matrix_approximation_rank"]
        self.start_powerSGD_iter = kw["start_powerSGD_iter"]
        self.min_compression_rate = kw["min_compression_rate"]
        self.use_error_feedback = kw["use_error_feedback"]
        self.warm_start = kw["warm_start"]
        self.orthogonalization_epsilon = kw["orthogonalization_epsilon"]
        self.random_seed = kw["random_seed"]
        self.compression_stats_logging_frequency = max(1, kw["compression_stats_logging_frequency"])
        self.batch_tensors_with_same_shape = kw["batch_tensors_with_same_shape"]
        self.iter = 0
        self.next_stats_report = 0
        self._timeout, self._pipeline = kw["timeout"], kw["pipeline"]
        # start_iter 0: the warm-up is counted here in steps, as PyTorch's (LOWRANK_START_ITER
        # would otherwise add per-buffer calls of its own).
        self._config = dict(approx_rank=self.matrix_approximation_rank, start_iter=0,
                            min_compression_rate=float(self.min_compression_rate),
                            error_feedback=bool(self.use_error_feedback),
                            warm_start=bool(self.warm_start),
                            ortho_epsilon=float(self.orthogonalization_epsilon),
                            seed=int(self.random_seed), timeout=self._timeout,
                            pipeline=self._pipeline)
        self._comms = {}    # "cpu" / "cuda" -> Communicator
        self._workers = {}  # the same keys -> Worker
        self._buckets = {}  # bucket index -> _Record
        self._seen = set()  # bucket indices called in the current step
        self._param_pos = {}  # a parameter's identity -> its position (see _param_key)
        self._pending = []  # _Entry: states waiting for their bucket (checkpoint, or a rebuild)
        self._unused_warning = False  # warn about checkpoint entries left at the end of the step
        self._snapshotted = False     # this step already saved the old buckets' states
        # The buckets of the last warm-up step (index -> (key, shapes)) and of the current one:
        # a checkpoint taken when compression starts holds no lowrank state, only these, so that
        # a restart reduces the same buckets (not DDP's first-step bucket) at its first step.
        self._warmup_buckets, self._warmup_seen = {}, {}
        self._closed = False
        _live_states.add(self)

    # ---- PyTorch's interface -------------------------------------------------------------------
    def maybe_increase_iter(self, bucket):
        """Counts a step when DDP hands the last bucket of the backward pass."""
        if bucket.is_last():
            self.iter += 1
        if self.iter == self.start_powerSGD_iter and bucket.is_last():
            logger.info("lowrank: PowerSGD compression starts after %d steps", self.iter)

    def compression_stats(self):
        """(compress_rate, numel_before_compression, numel_after_compression) as PyTorch's: input
        elements of the compressed calls (and their exact parts) per element sent, from lowrank."""
        s = self.stats()
        if not s:
            return 0.0, 0, 0
        before = s["compressedElements"] + s["exactElements"]
        return s["ratio"], before, s["payloadElements"]

    # ---- lowrank's additions -------------------------------------------------------------------
    def stats(self):
        """lowrank's counters (lowrankGetStats), summed over this state's communicators, after
        the work queued so far has run: calls, compressedCalls, ratio, stateBytes, buffers, ..."""
        total = {}
        for dev, comm in self._comms.items():
            self._workers[dev].drain()
            for k, v in comm.stats().items():
                total[k] = total.get(k, 0) + v
        if total:
            total["ratio"] = ((total["compressedElements"] + total["exactElements"])
                              / total["payloadElements"] if total["payloadElements"] else 0.0)
        return total

    def view(self, bucket_index):
        """lowrankBufferGetView of a bucket's buffer (dict), None if lowrank never saw it. A bucket
        whose state came from a checkpoint of other buckets (see state_dict) is reduced as
        several lowrank buffers: then a list of their views."""
        rec = self._buckets.get(bucket_index)
        if rec is None:
            return None
        self._workers[rec.device].drain()
        comm = self._comms[rec.device]
        views = [comm.view(seg.ptr) for seg in rec.segments]
        return views[0] if rec.segments[0].gather is None else views

    def communicator(self, device="cpu"):
        """The lowrank.Communicator this state uses for buckets on `device` (made if needed:
        collective over process_group, as the constructor)."""
        return self._comm(device)

    def close(self, timeout=None):
        """Finish queued work, free every bucket's state and destroy the communicators (not
        collective). The hook refuses a closed state: make a new one to go on training. Called at
        interpreter exit for every state still open. timeout: seconds to wait for queued work
        (None: as long as it takes, bounded by lowrank's own timeout); past it the communicator
        is aborted."""
        self._closed = True
        for dev in list(self._comms):
            worker, comm = self._workers.pop(dev), self._comms.pop(dev)
            if not worker.stop(timeout):
                comm.abort()  # a call blocked on a peer: end it, then let the thread finish
                worker.stop(timeout)
            comm.destroy()
        self._buckets.clear()
        self._pending = []
        _live_states.discard(self)

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self):
        """This rank's state of the hook, to save with the model and the optimizer (every rank
        its own: the residuals differ from rank to rank). A dict of plain Python types, bytes
        included (torch.load with weights_only=True, torch's default since 2.6, takes it; tested
        with torch 2.11; torch 1.13's weights_only refuses bytes: load with its default):
          "format": "lowrank.torch.PowerSGDState", "version": 1;
          "config": the settings load_state_dict checks: matrix_approximation_rank,
            start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start,
            orthogonalization_epsilon, random_seed;
          "options": the others, not checked: compression_stats_logging_frequency,
            batch_tensors_with_same_shape, timeout, pipeline;
          "iter", "next_stats_report": the step counters (ints);
          "rank", "world_size": this rank in process_group and the group's size (None if
            torch.distributed is not initialized);
          "buckets": a list, one dict per lowrank buffer holding state (during the warm-up: the
            buckets of its last step, with "state" None, so that a restart saved when
            compression starts reduces the same buckets): "params" (the key: a tuple of ints,
            the bucket's parameters, below),
            "shapes" (a tuple of their shapes, each a tuple of ints), "bucket" (DDP's index of
            the bucket when saved, for reading only) and "state" (bytes of
            lowrank.Communicator.save_state: the residual, the warm-start Q, the call count).
        The key: every parameter is numbered in the order DDP first hands it to the hook in the
        process (DDP's first step, whose buckets DDP makes from the model's parameter order), and
        a bucket is the tuple of its parameters' numbers, in the bucket's order. A process that
        builds the same model with the same DDP arguments numbers them the same, so the state
        finds its parameters whatever bucket indices DDP gives after a restart or a rebuild.
        Waits for the work queued so far. Local, not collective.
        Raises LowrankError (a closed state). After a step that failed (backward raised), it
        still returns what lowrank holds, but the step count includes the failed step: save
        from the last step that succeeded instead.
        Thread safety: call it between steps (after optimizer.step()), on the training thread."""
        self._check_open("state_dict")
        for worker in self._workers.values():
            worker.drain()
        buckets = []
        for index in sorted(self._buckets):
            rec = self._buckets[index]
            comm = self._comms[rec.device]
            for seg in rec.segments:
                data = _save_or_none(comm, seg.ptr)
                if data is not None:
                    buckets.append({"params": seg.pkey, "shapes": seg.shapes, "bucket": index,
                                    "state": data})
        # loaded and not yet used (no compressed step since): kept as they came
        buckets += [e.as_dict() for e in self._pending if e.checkpoint]
        if not buckets and not self._buckets:
            # Saved when compression starts: no state yet, the buckets' parameters only.
            buckets = [{"params": pkey, "shapes": shapes, "bucket": index, "state": None}
                       for index, (pkey, shapes) in sorted(self._warmup_buckets.items())]
        rank = world = None
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        return {"format": _FORMAT, "version": _VERSION,
                "config": {k: getattr(self, k) for k in _CHECKED},
                "options": {"compression_stats_logging_frequency":
                            self.compression_stats_logging_frequency,
                            "batch_tensors_with_same_shape": self.batch_tensors_with_same_shape,
                            "timeout": self._timeout, "pipeline": self._pipeline},
                "iter": self.iter, "next_stats_report": self.next_stats_report,
                "rank": rank, "world_size": world, "buckets": buckets}

    def load_state_dict(self, state_dict):
        """Take the state_dict() this rank saved: the step counters now, each bucket's lowrank
        state at its first compressed step from now on (on the hook's thread: set_layout,
        restore_state, then the allreduce). Call it on every rank, each with its own file, before
        the first step with this state; not collective. What this state held is dropped; a
        bucket with nothing saved starts afresh; saved buckets that no bucket takes by the end of
        the first compressed step are logged (WARNING, logger "lowrank.torch") and dropped.
        A bucket's state is checked across ranks at its first compressed call: a rank that
        restored it while another did not, or states of different steps, make every rank's
        backward raise lowrankInvalidUsage.
        Raises ValueError: not a state_dict of this class or version, a malformed entry (its
        structure: the bytes themselves are checked by lowrank when restored, at the first
        compressed step, where corrupt bytes raise on every rank), a setting that differs from
        this state's (each named, with both values), another rank's or another world size's
        state; nothing is changed then. LowrankError: a closed state.
        Thread safety: call it between steps, on the training thread."""
        self._load(state_dict, check_rank=True)

    def _load(self, state_dict, check_rank):
        self._check_open("load_state_dict")
        entries = _check_state_dict(state_dict)
        diffs = [f"{k}: saved {state_dict['config'][k]!r}, this state {getattr(self, k)!r}"
                 for k in _CHECKED if not _same(state_dict["config"][k], getattr(self, k))]
        if diffs:
            raise ValueError("PowerSGDState.load_state_dict: the state was saved with other "
                             "settings: " + "; ".join(diffs))
        if check_rank and dist.is_available() and dist.is_initialized():
            here = (dist.get_rank(self.process_group), dist.get_world_size(self.process_group))
            saved = (state_dict["rank"], state_dict["world_size"])
            if saved[0] is not None and saved[1] != here[1]:
                raise ValueError(f"PowerSGDState.load_state_dict: the state was saved by a world "
                                 f"of {saved[1]} ranks, this one has {here[1]}: residuals cannot "
                                 "be split or merged; start the hook afresh (load the model and "
                                 "the optimizer only, and set state.iter)")
            if saved[0] is not None and saved != here:
                raise ValueError(f"PowerSGDState.load_state_dict: the state of rank {saved[0]} of "
                                 f"{saved[1]}, loaded on rank {here[0]} of {here[1]}: every rank "
                                 "loads the state it saved")
        for worker in self._workers.values():
            worker.drain()
        for rec in self._buckets.values():
            for seg in rec.segments:
                self._comms[rec.device].release(seg.ptr)
        self._buckets.clear()
        self._seen.clear()
        self._snapshotted = False
        self._pending = entries
        self._unused_warning = bool(entries)
        self.iter = int(state_dict["iter"])
        self.next_stats_report = int(state_dict["next_stats_report"])

    def __getstate__(self):
        """What pickle saves: everything but the process group, as PyTorch's PowerSGDState (the
        dict of state_dict()); lowrank's communicators and threads are not saved either."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state. "
                       "lowrank's communicators are not saved either: the first compressed step "
                       "after loading makes them again.")
        return self.state_dict()

    def __setstate__(self, state):
        """The unpickled state: process_group None (the default group; set
        `state.process_group` before the first compressed step for another), no communicator
        until the first compressed step makes it (collective over the group, on every rank at
        that step), the saved buckets staged as by load_state_dict."""
        _check_state_dict(state)
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world size). "
                       "If a different group is desired, please set `self.process_group` after "
                       "PowerSGD state is loaded.")
        self._set_settings(None, {**state["config"], **state["options"]})
        self._load(state, check_rank=False)  # the group it was saved on is not known

    # ---- internals -----------------------------------------------------------------------------
    def _check_open(self, what):
        if self._closed:
            raise LowrankError(5, "this PowerSGDState was closed: make a new one", what)

    def _comm(self, device):
        self._check_open("powerSGD_hook")
        if device not in self._comms:
            self._comms[device] = communicator_from_process_group(self.process_group, device,
                                                                  **self._config)
            self._workers[device] = Worker(f"lowrank-{device}")
        return self._comms[device]

    def _note_warmup_bucket(self, bucket, pkey):
        """Records a warm-up step's bucket; the last one completes the step's record."""
        shapes = tuple(tuple(g.shape) for g in bucket.gradients())
        self._warmup_seen[bucket.index()] = (pkey, shapes)
        if bucket.is_last():
            self._warmup_buckets, self._warmup_seen = self._warmup_seen, {}

    def _param_key(self, bucket):
        """The bucket's key: the numbers of its parameters, each numbered at its first sight in
        this process (its identity: device, address, shape). Objects without parameters() (and
        those whose parameters do not match the gradients one to one) are keyed by gradients."""
        grads = bucket.gradients()
        params = bucket.parameters() if hasattr(bucket, "parameters") else grads
        if len(params) != len(grads):
            params = grads
        key = []
        for p in params:
            ident = (p.device.type, p.device.index, p.data_ptr(), tuple(p.shape))
            n = self._param_pos.get(ident)
            if n is None:
                n = self._param_pos[ident] = len(self._param_pos)
            key.append(n)
        return tuple(key)

    def _plan_bucket(self, bucket, buf, device, pkey, errors):
        """What the worker runs for this bucket: (setup, segments). setup: callables run in
        order before the allreduce (save the old buckets' states at a rebuild, release stale
        buffers, set the layout, restore a state; a failed restore goes to `errors`). segments:
        the lowrank buffers that reduce the bucket. Records the bucket."""
        shapes = tuple(tuple(g.shape) for g in bucket.gradients())
        if sum(_numel(s) for s in shapes) != buf.numel():
            raise InvalidArgumentError(4, f"bucket {bucket.index()}: its gradients have "
                                          f"{sum(_numel(s) for s in shapes)} elements, its buffer "
                                          f"{buf.numel()}", "powerSGD_hook")
        index = bucket.index()
        ident = (device, buf.data_ptr(), shapes, pkey)
        old = self._buckets.get(index)
        if index in self._seen and (old is None or old.ident != ident):
            raise LowrankError(5, f"bucket {index} came twice in one step with other buffers: one "
                                  "PowerSGDState serves one DDP model (make one per model)",
                               "powerSGD_hook")
        if old is not None and old.ident == ident:
            self._seen.add(index)
            return [], old.segments
        actions = []
        if not self._snapshotted:
            # DDP rebuilt its buckets (or this is the first step): before any layout changes,
            # the old buckets' states are saved, for a new bucket of the same parameters.
            actions += self._snapshot(device)
            self._snapshotted = True
        self._seen.add(index)
        if old is not None:
            actions += self._release_unless_live(old, exclude=index)
        segments, setup = self._segments(device, buf, shapes, pkey, errors)
        self._buckets[index] = _Record(ident, segments)
        return actions + setup, segments

    def _snapshot(self, device):
        """Entries for the states of the buckets recorded before this step (on `device`, not yet
        seen in this step), filled by the returned action on the worker."""
        comm = self._comms[device]
        pairs = [(_Entry(seg.pkey, seg.shapes, None, checkpoint=False, device=device), seg)
                 for i, rec in self._buckets.items() if i not in self._seen and rec.device == device
                 for seg in rec.segments]
        if not pairs:
            return []
        self._pending += [e for e, _ in pairs]

        def save():
            for e, seg in pairs:
                e.state = _save_or_none(comm, seg.ptr)
        return [save]

    def _segments(self, device, buf, shapes, pkey, errors):
        """The lowrank buffers of a new bucket and their setup. A pending state of exactly this
        bucket's parameters: restored into the bucket's buffer. Else saved buckets of the
        checkpoint whose parameters all lie in this bucket (DDP's first step after a restart
        has other buckets than the step that saved: one bucket of every parameter): each gets a
        buffer of its own, filled from the bucket's gradients in the saved order, and the rest
        of the bucket another (a fresh state). Else the bucket's buffer, fresh."""
        comm = self._comms[device]
        usable = [e for e in self._pending if e.device in (None, device)]
        exact = next((e for e in usable if e.pkey == pkey and e.shapes == shapes), None)
        if exact is not None:
            self._pending.remove(exact)
            seg = _Segment(buf, shapes, pkey, None)
            return [seg], [_set_layout(comm, seg), _restore(comm, seg, exact, errors)]
        where = {p: j for j, p in enumerate(pkey)}
        chosen, taken = [], set()
        for e in usable:
            idx = tuple(where.get(p, -1) for p in e.pkey)
            if (not e.checkpoint or -1 in idx or len(set(idx)) != len(idx) or taken & set(idx)
                    or tuple(shapes[j] for j in idx) != e.shapes):
                continue
            chosen.append((e, idx))
            taken |= set(idx)
        if not chosen:
            seg = _Segment(buf, shapes, pkey, None)
            return [seg], [_set_layout(comm, seg)]
        rest = tuple(j for j in range(len(pkey)) if j not in taken)
        starts = [0]
        for shape in shapes:
            starts.append(starts[-1] + _numel(shape))
        segments, setup = [], []
        for e, idx in chosen + ([(None, rest)] if rest else []):
            scratch = torch.empty(sum(_numel(shapes[j]) for j in idx), dtype=buf.dtype,
                                  device=buf.device)
            seg = _Segment(scratch, tuple(shapes[j] for j in idx), tuple(pkey[j] for j in idx),
                           tuple((starts[j], _numel(shapes[j])) for j in idx))
            segments.append(seg)
            setup.append(_set_layout(comm, seg))
            if e is not None:
                self._pending.remove(e)
                setup.append(_restore(comm, seg, e, errors))
        logger.info("lowrank: a bucket of %d parameters takes the state of %d saved buckets (and "
                    "%d parameters afresh): reduced as %d buffers until DDP rebuilds it",
                    len(pkey), len(chosen), len(rest), len(segments))
        return segments, setup

    def _release_unless_live(self, rec, exclude):
        """Release rec's buffers unless another live bucket now uses that address."""
        live = {(r.device, seg.ptr) for i, r in self._buckets.items() if i != exclude
                for seg in r.segments}
        comm = self._comms[rec.device]
        return [_release(comm, seg) for seg in rec.segments if (rec.device, seg.ptr) not in live]

    def _end_of_step(self):
        """After the last bucket: release the buffers of buckets DDP no longer has, drop the
        states no bucket took (a checkpoint's: with a warning)."""
        actions = []
        for index in [i for i in self._buckets if i not in self._seen]:
            rec = self._buckets.pop(index)
            actions += self._release_unless_live(rec, exclude=index)
        left = [e for e in self._pending if e.checkpoint]
        if self._unused_warning and left:
            logger.warning("lowrank: %d saved bucket states were not used by the first compressed "
                           "step after loading (no bucket of those parameters: another model or "
                           "other DDP arguments?); those parameters started afresh. Unused: %s",
                           len(left), ", ".join(f"bucket {e.bucket} ({len(e.pkey)} parameters)"
                                                for e in left))
        self._unused_warning = False
        self._pending = []
        self._seen.clear()
        self._snapshotted = False
        return actions


_FORMAT, _VERSION = "lowrank.torch.PowerSGDState", 1
_CHECKED = ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
            "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed")
_OPTIONS = ("compression_stats_logging_frequency", "batch_tensors_with_same_shape", "timeout",
            "pipeline")


class _Segment:
    """One lowrank buffer reducing a bucket, or a part of it: the bucket's own buffer (gather
    None), or a tensor of its own that the job fills from the bucket's gradients, `gather` giving
    (start in the bucket's buffer, elements) of each, in this buffer's order, and copies back
    after the allreduce."""
    __slots__ = ("buf", "ptr", "shapes", "pkey", "gather")

    def __init__(self, buf, shapes, pkey, gather):
        self.buf, self.ptr, self.shapes, self.pkey, self.gather = (buf, buf.data_ptr(), shapes,
                                                                   pkey, gather)


class _Record:
    """A bucket as lowrank last saw it: ident (device, buffer address, shapes, parameter key)
    and its segments."""
    __slots__ = ("ident", "device", "segments")

    def __init__(self, ident, segments):
        self.ident, self.device, self.segments = ident, ident[0], segments


class _Entry:
    """A state waiting for its bucket: from a checkpoint (device None, bucket: its index when
    saved), or saved at a rebuild (state filled by the worker; None: nothing to restore)."""
    __slots__ = ("pkey", "shapes", "state", "checkpoint", "device", "bucket")

    def __init__(self, pkey, shapes, state, checkpoint, device=None, bucket=None):
        self.pkey, self.shapes, self.state = pkey, shapes, state
        self.checkpoint, self.device, self.bucket = checkpoint, device, bucket

    def as_dict(self):
        return {"params": self.pkey, "shapes": self.shapes, "bucket": self.bucket,
                "state": self.state}


def _check_state_dict(sd):
    """The checkpoint entries of a state_dict(); ValueError if it is not one."""
    if not isinstance(sd, dict) or sd.get("format") != _FORMAT:
        raise ValueError("PowerSGDState.load_state_dict: not a state_dict() of "
                         "lowrank.torch.PowerSGDState")
    if sd.get("version") != _VERSION:
        raise ValueError(f"PowerSGDState.load_state_dict: format version {sd.get('version')!r}, "
                         f"this lowrank reads version {_VERSION}")
    missing = [k for k in ("config", "options", "iter", "next_stats_report", "rank",
                           "world_size", "buckets") if k not in sd]
    missing += [f"config.{k}" for k in _CHECKED if k not in sd.get("config", {})]
    missing += [f"options.{k}" for k in _OPTIONS if k not in sd.get("options", {})]
    if missing:
        raise ValueError(f"PowerSGDState.load_state_dict: missing {', '.join(missing)}")
    bad = [k for k in ("iter", "next_stats_report")
           if not isinstance(sd[k], int) or isinstance(sd[k], bool) or sd[k] < 0]
    bad += [] if isinstance(sd["buckets"], (list, tuple)) else ["buckets"]
    if bad:  # checked here, before load_state_dict changes anything
        raise ValueError("PowerSGDState.load_state_dict: malformed "
                         + ", ".join(f"{k} ({sd[k]!r})" for k in bad))
    entries = []
    for n, b in enumerate(sd["buckets"]):
        try:
            pkey = tuple(int(p) for p in b["params"])
            shapes = tuple(tuple(int(d) for d in s) for s in b["shapes"])
            state = b["state"]  # None: saved when compression started, no lowrank state yet
            ok = (state is None or isinstance(state, (bytes, bytearray))) and \
                len(pkey) == len(shapes) > 0
        except (TypeError, ValueError, KeyError):
            ok = False
        if not ok:
            raise ValueError(f"PowerSGDState.load_state_dict: buckets[{n}] is not a saved bucket "
                             "(params, shapes, state bytes)")
        entries.append(_Entry(pkey, shapes, None if state is None else bytes(state),
                              checkpoint=True, bucket=b.get("bucket")))
    return entries


def _same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return a == b


def _save_or_none(comm, ptr):
    """comm.save_state(ptr), None where the buffer holds no state (never called compressibly)."""
    try:
        return comm.save_state(ptr)
    except LowrankError as e:
        if e.code == 5 and not comm.view(ptr)["planned"]:
            return None
        raise


def _set_layout(comm, seg):
    return lambda: comm.set_layout(seg.ptr, seg.shapes)


def _restore(comm, seg, entry, errors):
    def act():
        if entry.state is None:
            return
        try:
            comm.restore_state(seg.ptr, entry.state)
        except LowrankError as e:  # the allreduce still runs: the other ranks' check fails too
            errors.append(e)
    return act


def _release(comm, seg):
    buf = seg.buf  # held until the release ran: no other buffer takes the address before
    return lambda: (comm.release(seg.ptr), buf)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _exact_allreduce(state, buf):
    """Warm-up: DDP's own exact average over process_group, as PyTorch's hook does."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buf.div_(dist.get_world_size(group))
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def powerSGD_hook(state, bucket):
    """DDP communication hook: the bucket's gradients averaged over the process group's ranks,
    compressed by lowrank's PowerSGD (per tensor, the bucket's layout from its gradients' shapes).

    state: a PowerSGDState. bucket: DDP's GradBucket (or any object with index(), buffer(),
    gradients() and is_last(); parameters() if it has it). Returns a torch.futures.Future of the
    bucket's buffer, reduced in place: completed by the communicator's own thread, so backward
    goes on meanwhile; for CUDA buckets the call is queued on the current stream and the future
    carries that dependency.
    Raises InvalidArgumentError (a non-contiguous or mixed-device bucket, an unsupported dtype);
    the future completes with LowrankError when lowrank fails (a dead peer, ranks whose buckets
    differ, a restored state that does not fit or that not every rank restored:
    lowrankInvalidUsage on every rank)."""
    buf = bucket.buffer()
    info = describe(buf, f"bucket {bucket.index()}'s buffer", "powerSGD_hook")
    for g in bucket.gradients():
        if g.device != buf.device:
            raise InvalidArgumentError(4, f"bucket {bucket.index()} mixes devices: a gradient on "
                                          f"{g.device}, the buffer on {buf.device}", "powerSGD_hook")
    pkey = state._param_key(bucket)  # numbers the parameters from DDP's first step on
    if state.iter < state.start_powerSGD_iter:
        state._note_warmup_bucket(bucket, pkey)
        state.maybe_increase_iter(bucket)
        return _exact_allreduce(state, buf)

    device = info.device
    comm = state._comm(device)
    errors = []  # restores that failed (raised after the allreduce, which every rank runs)
    setup, segments = state._plan_bucket(bucket, buf, device, pkey, errors)
    # After the last bucket, the buffers of buckets DDP no longer has (a rebuild) are released.
    after = state._end_of_step() if bucket.is_last() else []
    state.maybe_increase_iter(bucket)
    stream = torch.cuda.current_stream(buf.device) if device == "cuda" else None
    fut = torch.futures.Future(devices=[buf.device]) if device == "cuda" else torch.futures.Future()

    def job():
        for act in setup:
            act()
        try:
            for seg in segments:
                _reduce(comm, buf, seg, stream)
        except LowrankError as e:
            if errors:  # this rank's restore failed: the cause of the others' failure too
                raise errors[0] from e
            raise
        for act in after:
            act()
        if errors:
            raise errors[0]
        return buf

    # CUDA: the job runs, and the future records its event, with the hook's stream current on the
    # bucket's device, so that DDP's later kernels wait for lowrank's (the host does not).
    context = (lambda: _on_stream(buf.device, stream)) if stream is not None else None
    state._workers[device].submit(job, fut, context)
    _maybe_log_stats(state)
    # torch's Future.set_exception stores the exception as the value (a Python-side unwrap), which
    # DDP's C++ reads as "Unable to cast ... to Tensor"; re-raised inside then(), it becomes the
    # child future's error, and backward raises RuntimeError with lowrank's message.
    return fut.then(_value)


def _reduce(comm, buf, seg, stream):
    """The allreduce of one segment of the bucket `buf` (on the worker, the hook's stream
    current for CUDA): in place, or through the segment's own buffer."""
    if seg.gather is None:
        comm.allreduce(buf, op="avg", stream=stream)
        return
    views, off = [], 0
    for start, n in seg.gather:
        views.append((seg.buf[off:off + n], buf[start:start + n]))
        off += n
    for mine, theirs in views:
        mine.copy_(theirs)
    comm.allreduce(seg.buf, op="avg", stream=stream)
    for mine, theirs in views:
        theirs.copy_(mine)


@contextlib.contextmanager
def _on_stream(device, stream):
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


def _value(fut):
    return fut.wait()


def _maybe_log_stats(state):
    if state.iter < state.next_stats_report or not logger.isEnabledFor(logging.INFO):
        return
    rate, before, after = state.compression_stats()
    logger.info("lowrank: step %d, compression rate %.1f, %d elements before, %d after",
                state.iter, rate, before, after)
    state.next_stats_report = state.iter + state.compression_stats_logging_frequency
