"""PowerSGDState and powerSGD_hook: PyTorch's DDP PowerSGD hook, with lowrank doing the work.

The arguments and their defaults are those of PyTorch's
torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState; differences are listed
in each argument's description and in docs/pytorch.md. Method: PowerSGD (Vogels, Karimireddy,
Jaggi, NeurIPS 2019, arXiv 1905.13727), per tensor as PyTorch's hook: each gradient of >= 2
dimensions viewed as (shape[0], -1) and compressed if (n + m) k rate < n m, the rest exact.
Each bucket is handed to lowrank as it is: its buffer, declared with its parameters' ids
(lowrankBufferSetTensors), so that the state (residual, warm-start Q, warm-up count) belongs to
the parameters and follows them through DDP's bucket rebuilds and restarts.
"""
import atexit
import collections
import contextlib
import datetime
import functools
import logging
import math
import numbers
import zlib

import torch
import torch.distributed as dist

from .._buffers import describe
from ..comm import as_int, tensor_array
from ..errors import InvalidArgumentError, LowrankError
from .adaptive import AdaptiveRank
from .memory import use_torch_memory
from .process_group import communicator_from_process_group, require_initialized
from .signals import accumulate, combine, measure, take_norms
from .tensor_ranks import TensorRanks
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
    the buffer lowrank last reduced for each bucket. Construct it on every rank at the same point
    (it makes a lowrank communicator over the process group: a collective).

    Args (PyTorch's names and defaults):
      process_group: the torch.distributed group whose ranks reduce together (None: the default
        group). lowrank makes its own communicator over the same ranks: for CPU buckets a host
        communicator (UCX), for CUDA buckets an NCCL communicator; the group itself carries only
        the set-up.
      matrix_approximation_rank (1): the approximation rank k (lowrankConfig_t.approxRank).
        0 turns compression off (every step an exact allreduce by lowrank).
      start_powerSGD_iter (1000): the warm-up: each parameter's gradient is allreduced exactly,
        by lowrank over its own communicator, for its first start_powerSGD_iter steps
        (lowrankConfig_t.startIter, counted per parameter by lowrank), then compressed. Unlike
        PyTorch's, values <= 1 are allowed with error feedback and warm start: lowrank keys the
        state by parameter (tensor ids), so each parameter keeps its own through DDP's bucket
        rebuilds.
      min_compression_rate (2): a tensor is compressed only if (n + m) k rate < n m.
      use_error_feedback (True), warm_start (True): as PyTorch's.
      orthogonalization_epsilon (0): added to column norms in Gram-Schmidt (lowrank uses it for
        k <= 2; Householder QR above needs none, and a zero column never becomes NaN).
      random_seed (0): seed of the first Q, the same on every rank (lowrank draws each tensor's
        from the seed and the tensor's id with its own generator, so the numbers differ from
        PyTorch's for the same seed).
      compression_stats_logging_frequency (10000): every so many steps, lowrank's counters are
        logged at INFO on the logger "lowrank.torch".
      batch_tensors_with_same_shape (False): accepted and ignored: lowrank's fused passes take all
        tensors of a bucket at once whatever their shapes.
    lowrank's own (keywords only):
      timeout: seconds any wait for a peer may last (LOWRANK_TIMEOUT; default 300); a dead peer
        makes every rank's backward raise within it.
      pipeline: overlap factor allreduces with compression (LOWRANK_PIPELINE; default on).
      device: "cpu", "cuda" (the current CUDA device) or "cuda:N", the communicator to make now
        (default: "cuda" for an NCCL group, else "cpu"); a bucket on another device makes that
        device's at its first step (one communicator per CUDA device, on that device).
      exclude: parameters allreduced exactly, never compressed (embeddings, an output head):
        a collection of parameters (the tensors) and/or their names (str), or a function
        f(name, parameter) -> bool called once per parameter of `model`. Default: none.
      rank_of: parameters with an approximation rank of their own: a dict {parameter or name:
        k} (k an int in [1, 65536]; 0: exact; None: matrix_approximation_rank), or a function
        f(name, parameter) -> k or None called once per parameter of `model`. Default: none.
        A parameter's own k still passes the compression-rate test (else it is exact), and 1-D
        parameters are always exact. exclude wins over rank_of.
      model: the model whose named_parameters() give the names exclude and rank_of use (a DDP
        model is unwrapped: "fc.weight", not "module.fc.weight"); needed for names and functions.
      The settings reach lowrank's declaration of each bucket (lowrankTensor_t.approxRank) from
      the first step; tensor_ranks() shows each parameter's k in force. They are configuration,
      like the model: state_dict() does not hold them (give them again to a new state, or
      set_tensor_ranks after unpickling); the saved tensors carry the k they were made at, and
      one restored under another k goes on as after set_tensor_ranks.
      adaptive: an AdaptiveRank (lowrank.torch.adaptive): each parameter that exclude and
        rank_of leave to the default (and that has 2 or more dimensions) gets its k from the
        rule, decided every rule.window steps from allreduced numbers with a lag of rule.lag
        whole steps, so every rank switches at the same step to the same k. Default: None
        (every such parameter at matrix_approximation_rank). state_dict holds the rule's
        memory (its last norms and ks, the window's partial sums, numbers awaiting their
        decision), which load_state_dict gives back to a state made with a rule, so a restart
        decides as the uninterrupted run (one without ignores it; a pickled state has no rule:
        give it again).
    Raises LowrankError if torch.distributed is not initialized or lowrank cannot start;
    ValueError or TypeError for an argument outside lowrank's range (an int where one is needed,
    matrix_approximation_rank in [0, 65536], min_compression_rate >= 1, ...) and for bad
    exclude, rank_of or model (each named).
    Thread safety: one state serves one DDP model; its hook is called by DDP's autograd thread.

    The ids: every parameter is numbered in the order DDP first hands it to the hook in the
    process (see state_dict, "the ids"). Checkpoint (docs/pytorch.md, "Checkpoint"): state_dict()
    / load_state_dict(sd), or pickling the state (torch.save(state)); every rank saves and loads
    its own, with the model and the optimizer."""

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0,
                 compression_stats_logging_frequency=10_000, batch_tensors_with_same_shape=False,
                 *, timeout=None, pipeline=None, device=None, exclude=None, rank_of=None,
                 model=None, adaptive=None):
        settings = dict(
            matrix_approximation_rank=matrix_approximation_rank,
            start_powerSGD_iter=start_powerSGD_iter, min_compression_rate=min_compression_rate,
            use_error_feedback=use_error_feedback, warm_start=warm_start,
            orthogonalization_epsilon=orthogonalization_epsilon, random_seed=random_seed,
            compression_stats_logging_frequency=compression_stats_logging_frequency,
            batch_tensors_with_same_shape=batch_tensors_with_same_shape,
            timeout=timeout, pipeline=pipeline)
        _check_settings(settings)  # these and the next checked before anything is made
        ranks = TensorRanks(exclude, rank_of, model)
        if matrix_approximation_rank == 0 and rank_of is not None:
            raise ValueError("rank_of: matrix_approximation_rank=0 turns compression off for "
                             "every parameter, rank_of's included (lowrank's k = 0 is "
                             "uncompressed); give the default k instead, and rank_of 0 for "
                             "the parameters to keep exact")
        if adaptive is not None:
            if not isinstance(adaptive, AdaptiveRank):
                raise TypeError(f"adaptive must be a lowrank.torch.adaptive.AdaptiveRank, not "
                                f"{type(adaptive).__name__}")
            if matrix_approximation_rank == 0:
                raise ValueError("adaptive: matrix_approximation_rank=0 turns compression off "
                                 "for every parameter; an adaptive rank needs a k > 0")
            adaptive = adaptive.bind(matrix_approximation_rank)
        require_initialized()
        self._set_settings(process_group, settings)
        self._ranks, self._adaptive = ranks, adaptive
        if device is None:
            backend = str(dist.get_backend(process_group)).lower()
            device = "cuda" if backend == "nccl" else "cpu"
        self._comm(device)

    def _set_settings(self, process_group, kw):
        """The arguments of __init__ (kw: by name, checked by _check_settings) and an empty
        runtime: no communicator yet."""
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
        # The warm-up is lowrank's, per tensor id (its startIter); the hook's argument wins over
        # LOWRANK_START_ITER.
        self._config = dict(approx_rank=self.matrix_approximation_rank,
                            start_iter=int(self.start_powerSGD_iter),
                            min_compression_rate=float(self.min_compression_rate),
                            error_feedback=bool(self.use_error_feedback),
                            warm_start=bool(self.warm_start),
                            ortho_epsilon=float(self.orthogonalization_epsilon),
                            seed=int(self.random_seed), timeout=self._timeout,
                            pipeline=self._pipeline)
        self._comms = {}    # "cpu" / "cuda:N" (_comm_key) -> Communicator
        self._workers = {}  # the same keys -> Worker
        self._side_streams = {}  # (device, bucket index) -> torch.cuda.Stream (CUDA buckets)
        self._buckets = {}  # bucket index -> _Bucket: the last complete step's
        self._step = {}     # bucket index -> _Bucket: the current step's
        self._param_pos = {}  # a parameter's identity -> its id (see _param_key)
        # Per-parameter treatment (exclude, rank_of): the settings, and resolved at the next
        # step into each id's approxRank (_rank_by_id: ids numbered so far) and their names.
        self._ranks = TensorRanks()
        self._rank_by_id, self._ident_rank, self._warned_unmatched = None, None, False
        # The adaptive rank: the rule (None: off), each id's k from its last decision, the
        # buckets of this step's jobs ((device, address) -> (step, ids, shapes, the ids the rule
        # rules, whether the step measures)) and the numbers measured (step -> {id: (|window's sum of out|^2,
        # |E|^2, |M|^2)}, filled by the jobs).
        self._adaptive, self._adaptive_k, self._measure, self._signals = None, {}, {}, {}
        self._window_sums = {}  # id -> the sum of its outputs over this window (signals.accumulate)
        # A loaded state_dict: its entries (_Saved) wait for the next job on their device, which
        # stages them in lowrank through scratch buffers (released after the first step);
        # state_dict() returns them as loaded until a step has run; the ids they hold, with their
        # shapes, check the numbering and name those no bucket took.
        self._restores, self._scratch, self._loaded = [], [], None
        self._expect, self._unclaimed = {}, set()
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
        the work queued so far has run: calls, compressedCalls, ratio, stateBytes, buffers, ...;
        and "memory": {bucket index: the bytes its buffer holds (Communicator.memory: residual,
        factors, payload, workspaces, tables, pinned memory, total; docs/cuda.md, "Memory")} of
        the last complete step's buckets (left out with a library older than the query)."""
        total = {}
        for dev, comm in self._comms.items():
            self._workers[dev].drain()
            for k, v in comm.stats().items():
                total[k] = total.get(k, 0) + v
        if total:
            total["ratio"] = ((total["compressedElements"] + total["exactElements"])
                              / total["payloadElements"] if total["payloadElements"] else 0.0)
            memory = {index: self._comms[b.device].memory(b.ptr)
                      for index, b in sorted(self._buckets.items())
                      if hasattr(getattr(self._comms[b.device], "_lib", None),
                                 "lowrankBufferGetMemory")}
            if memory or not self._buckets:
                total["memory"] = memory
        return total

    def view(self, bucket_index):
        """lowrankBufferGetView of a bucket's buffer (dict), None if lowrank never saw it."""
        b = self._step.get(bucket_index) or self._buckets.get(bucket_index)
        if b is None:
            return None
        self._workers[b.device].drain()
        return self._comms[b.device].view(b.ptr)

    def set_tensor_ranks(self, exclude=None, rank_of=None, model=None):
        """Replace the per-parameter settings (exclude, rank_of, model: as the constructor's;
        model None keeps the one given before). From the next step each parameter is declared
        with its new treatment; a parameter whose k changes keeps its state in lowrank: its
        residual as it is, its warm-start Q cut to the first k columns or grown with fresh ones
        drawn alike on every rank (lowrankStats_t.rankChanges counts each change). Call it on
        every rank between the same two steps: ranks that all change a tensor, to different ks,
        make that step's backward raise lowrankInvalidUsage on every rank; a change on some
        ranks only fails the communicators (their calls go out of step): make a new state.
        Not collective.
        Raises ValueError, TypeError as the constructor (nothing changes then).
        Thread safety: between steps, on the training thread."""
        self._check_open("set_tensor_ranks")
        if model is None:
            model = self._ranks.model
        self._ranks = TensorRanks(exclude, rank_of, model)
        self._rank_by_id, self._ident_rank, self._warned_unmatched = None, None, False

    def tensor_ranks(self):
        """Each parameter's approximation rank in force at the last complete step, as lowrank
        planned it (lowrankBufferGetTensorRanks): {name: k}, keyed by the parameter's id
        (state_dict, "the ids") where no model was given or the model has no name for it. k is
        0 for a parameter allreduced exactly then: excluded, 1-D, failing the compression-rate
        test, or in its warm-up. Parameters of buckets not planned yet are left out. Waits for
        the work queued so far. Thread safety: between steps, on the training thread."""
        name_of = self._name_of_id()
        out = {}
        for _, b in sorted(self._buckets.items()):
            self._workers[b.device].drain()
            ks = self._comms[b.device].tensor_ranks(b.ptr)
            if len(ks) == len(b.ids):
                out.update((name_of.get(n, n), k) for n, k in zip(b.ids, ks))
        return out

    def adaptive_signals(self):
        """The adaptive rank's last decision: (measured step, {name: (gradient norm, compression
        error)}), the allreduced numbers it decided from (lowrank.torch.adaptive), keyed as
        tensor_ranks(); (None, {}) before the first decision or without a rule. The same on
        every comm rank. Thread safety: between steps, on the training thread."""
        if self._adaptive is None or self._adaptive.last is None:
            return None, {}
        step, signals = self._adaptive.last
        name_of = self._name_of_id()
        return step, {name_of.get(n, n): v for n, v in signals.items()}

    def _name_of_id(self):
        """{id: name} of the parameters numbered so far (the id itself where the model, if
        any, has no name for it)."""
        names = self._ranks.names()
        return {n: names.get(ident, n) for ident, n in self._param_pos.items()}

    def communicator(self, device="cpu"):
        """The lowrank.Communicator this state uses for buckets on `device` (made if needed:
        collective over process_group, as the constructor)."""
        self._comm(device)
        return self._comms[_comm_key(device)]

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
        self._buckets, self._step, self._restores, self._scratch = {}, {}, [], []
        _live_states.discard(self)

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self):
        """This rank's state of the hook, to save with the model and the optimizer (every rank
        its own: the residuals differ from rank to rank). A dict of plain Python types, bytes
        included (torch.load with weights_only=True, torch's default since 2.6, takes it; tested
        with torch 2.11; torch 1.13's weights_only refuses bytes: load with its default):
          "format": "lowrank.torch.PowerSGDState", "version": 2;
          "config": the settings load_state_dict checks: matrix_approximation_rank,
            start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start,
            orthogonalization_epsilon, random_seed;
          "options": the others, not checked: compression_stats_logging_frequency,
            batch_tensors_with_same_shape, timeout, pipeline;
          "iter", "next_stats_report": the step counters (ints);
          "rank", "world_size": this rank in process_group and the group's size (None if
            torch.distributed is not initialized);
          "buckets": a list, one dict per bucket of the last step: "params" (the ids of its
            parameters, a tuple of ints, below), "shapes" (a tuple of their shapes as declared
            to lowrank, each a tuple of ints), "device" ("cpu" or "cuda"), "bucket" (DDP's index
            of the bucket when saved, for reading only) and "state" (bytes of
            lowrank.Communicator.save_state, format 2: per id, its residual, warm-start Q and
            call count, warm-up included, with a CRC);
          "adaptive": None, or the adaptive rank's memory: "ks" ({id: k} of its last decisions),
            "norms" ({id: the gradient norm last measured}), "sums" ({id: the current window's
            sum of its averaged gradient so far, float32 bytes}) and "pending" ({step: {id:
            [3 floats]}}: this rank's numbers measured at a step whose decision is still to
            come), so that a restart decides as the run that did not stop would.
        The ids: every parameter is numbered in the order DDP first hands it to the hook in the
        process (DDP's first step). Without find_unused_parameters (or with static_graph), DDP's
        first step has one bucket per dtype and device holding every parameter in the model's
        order, whatever bucket_cap_mb: a process that builds the same model numbers the
        parameters the same, with any bucket_cap_mb, and each parameter's state finds it after a
        restart in whatever bucket DDP puts it. With find_unused_parameters (and no
        static_graph) DDP's first-step buckets depend on bucket_cap_mb: restart with the same
        one (a numbering that differs is refused where the shapes tell: see load_state_dict).
        A state loaded and not yet used by a step returns the loaded buckets as they came.
        Waits for the work queued so far. Local, not collective.
        Raises LowrankError (a closed state). After a step that failed (backward raised), it
        still returns what lowrank holds, but the step count includes the failed step: save
        from the last step that succeeded instead.
        Thread safety: call it between steps (after optimizer.step()), on the training thread."""
        self._check_open("state_dict")
        for worker in self._workers.values():
            worker.drain()
        if self._loaded is not None:
            version, buckets = self._loaded
        else:
            version, buckets = _VERSION, []
            for index, b in sorted(self._buckets.items()):
                data = _save_or_none(self._comms[b.device], b.ptr)
                if data is not None:
                    buckets.append({"params": b.ids, "shapes": b.shapes,
                                    "device": _kind(b.device),
                                    "bucket": index, "state": data})
        rank = world = None
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        return {"format": _FORMAT, "version": version,
                "config": {k: getattr(self, k) for k in _CHECKED},
                "options": {"compression_stats_logging_frequency":
                            self.compression_stats_logging_frequency,
                            "batch_tensors_with_same_shape": self.batch_tensors_with_same_shape,
                            "timeout": self._timeout, "pipeline": self._pipeline},
                "iter": self.iter, "next_stats_report": self.next_stats_report,
                "rank": rank, "world_size": world, "buckets": list(buckets),
                "adaptive": None if self._adaptive is None else
                {"ks": dict(self._adaptive_k), **self._adaptive.state_dict(),
                 "sums": {n: a.detach().float().cpu().contiguous().numpy().tobytes()
                          for n, a in self._window_sums.items()},
                 "pending": {m: {n: list(v) for n, v in got.items()}
                             for m, got in self._signals.items()}}}

    def load_state_dict(self, state_dict):
        """Take the state_dict() this rank saved (version 2, or version 1 of lowrank before tensor
        ids): the step counters now; each saved tensor's state is staged in lowrank at the next
        step (on the hook's thread, before its first allreduce: restore_state into scratch
        buffers declared with the saved ids, which turns version 1's per-bucket bytes into
        per-id states too), and installed by whichever bucket holds that parameter, in any
        bucketing (another bucket_cap_mb, DDP's first step after a restart). Call it on every
        rank, each with its own file, before the first step with this state; not collective.
        What this state held is dropped; a parameter with nothing saved starts afresh; saved
        states that no bucket takes in the first step are logged (WARNING, logger
        "lowrank.torch") and dropped. A tensor's state is checked across ranks at its first
        call: a rank that restored it while another did not, or states of different steps, make
        every rank's backward raise lowrankInvalidUsage.
        Raises ValueError: not a state_dict of this class or version, a malformed entry (its
        structure: the bytes themselves are checked by lowrank when staged, at the next step,
        where corrupt bytes raise on every rank), a setting that differs from this state's (each
        named, with both values), another rank's or another world size's state, saved ids whose
        shapes are not those of the parameters this state numbered so; nothing is changed then.
        LowrankError: a closed state; at the next step (every rank), a parameter numbered with a
        saved id of another shape (DDP's first step handed the parameters in another order than
        the run that saved: find_unused_parameters with another bucket_cap_mb, another model).
        Thread safety: call it between steps, on the training thread."""
        self._load(state_dict, check_rank=True)

    def _load(self, state_dict, check_rank):
        self._check_open("load_state_dict")
        entries = _check_state_dict(state_dict)
        adaptive_ks = None  # checked here, before anything changes
        if self._adaptive is not None and state_dict.get("adaptive"):
            saved = state_dict["adaptive"]
            try:
                AdaptiveRank().load_state_dict(saved)
                adaptive_ks = {int(n): int(k) for n, k in saved.get("ks", {}).items()}
                sums = {int(n): torch.frombuffer(bytearray(b), dtype=torch.float32).clone()
                        for n, b in saved.get("sums", {}).items()}
                pending = {int(m): {int(n): tuple(float(x) for x in v) for n, v in got.items()}
                           for m, got in saved.get("pending", {}).items()}
                if any(len(v) != 3 for got in pending.values() for v in got.values()):
                    raise ValueError("pending")
            except (ValueError, TypeError, AttributeError):
                raise ValueError("PowerSGDState.load_state_dict: a malformed \"adaptive\" "
                                 "entry") from None
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
        expect = {i: s for e in entries for i, s in zip(e.params, e.shapes)}
        clash = sorted((n, ident[3]) for ident, n in self._param_pos.items()
                       if n in expect and expect[n] != _declared_shape(ident[3]))
        if clash:
            raise ValueError("PowerSGDState.load_state_dict: " + _numbering_message(
                [(n, shape, expect[n]) for n, shape in clash]))
        for worker in self._workers.values():
            worker.drain()
        held = {(b.device, b.ptr) for b in (*self._buckets.values(), *self._step.values())}
        held |= {(dev, t.data_ptr()) for dev, t in self._scratch}
        for dev, ptr in held:
            self._comms[dev].release(ptr)  # the old states go (ids and staged restores alike)
        self._buckets, self._step, self._scratch = {}, {}, []
        self._restores = [e for e in entries if e.state is not None]
        self._loaded = (state_dict["version"], list(state_dict["buckets"]))
        self._expect, self._unclaimed = expect, set(expect)
        self.iter = int(state_dict["iter"])
        self.next_stats_report = int(state_dict["next_stats_report"])
        # what the steps before the load had measured and summed is not the loaded run's
        self._window_sums, self._signals, self._measure = {}, {}, {}
        if self._adaptive is not None:
            self._adaptive.last = None
        if adaptive_ks is not None:  # the rule goes on where it was
            self._adaptive.load_state_dict(state_dict["adaptive"])
            self._adaptive_k, self._rank_by_id = adaptive_ks, None
            self._window_sums, self._signals = sums, pending
        logger.info("lowrank: loaded the state of %d tensors (%d saved buckets, version %d), "
                    "staged at the next step for whichever bucket holds them", len(expect),
                    len(self._restores), state_dict["version"])

    def __getstate__(self):
        """What pickle saves: everything but the process group, as PyTorch's PowerSGDState (the
        dict of state_dict()); lowrank's communicators and threads are not saved either."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state. "
                       "lowrank's communicators are not saved either: the first step after "
                       "loading makes them again.")
        return self.state_dict()

    def __setstate__(self, state):
        """The unpickled state: process_group None (the default group; set
        `state.process_group` before the first step for another), no communicator until the
        first step makes it (collective over the group, on every rank at that step), the saved
        tensors staged as by load_state_dict."""
        _check_state_dict(state)
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world size). "
                       "If a different group is desired, please set `self.process_group` after "
                       "PowerSGD state is loaded.")
        settings = {**state["config"], **state["options"]}
        _check_settings(settings)
        self._set_settings(None, settings)
        self._load(state, check_rank=False)  # the group it was saved on is not known

    # ---- internals -----------------------------------------------------------------------------
    def _check_open(self, what):
        if self._closed:
            raise LowrankError(5, "this PowerSGDState was closed: make a new one", what)

    def _comm(self, device):
        """The communicator of `device` for the hook's jobs (made at the first call, a CUDA
        one on that device; with an adaptive rank, one whose allreduce also measures the buckets
        _declare asked for)."""
        self._check_open("powerSGD_hook")
        device = _comm_key(device)
        if device not in self._comms:
            on = torch.cuda.device(device) if device != "cpu" else contextlib.nullcontext()
            with on:  # lowrank's NCCL communicator is made on the current device
                self._comms[device] = communicator_from_process_group(
                    self.process_group, _kind(device), **self._config)
            if device != "cpu":  # its buckets' state in torch's memory (memory.py)
                use_torch_memory(self._comms[device], device)
            self._workers[device] = Worker(f"lowrank-{device}")
        if self._adaptive is not None:
            return _Measured(self, device, self._comms[device])
        return self._comms[device]

    def _side_stream(self, device, index):
        """The CUDA stream bucket `index`'s calls are queued on (one per bucket, so that a
        bucket's pass 1 does not wait behind the previous bucket's join)."""
        key = (str(device), index)
        if key not in self._side_streams:
            self._side_streams[key] = torch.cuda.Stream(device)
        return self._side_streams[key]

    def _param_key(self, bucket):
        """The ids of the bucket's parameters: each numbered at its first sight in this process
        (its identity: device, address, shape). Objects without parameters() (and those whose
        parameters do not match the gradients one to one) are keyed by gradients. A number a
        loaded state holds with another shape raises LowrankError (the numbering differs)."""
        grads = bucket.gradients()
        params = bucket.parameters() if hasattr(bucket, "parameters") else grads
        if len(params) != len(grads):
            params = grads
        key = []
        for p in params:
            ident = (p.device.type, p.device.index, p.data_ptr(), tuple(p.shape))
            n = self._param_pos.get(ident)
            if n is None:
                n = len(self._param_pos)
                want = self._expect.get(n)
                if want is not None and want != _declared_shape(ident[3]):
                    raise LowrankError(5, _numbering_message([(n, ident[3], want)]),
                                       "powerSGD_hook")
                self._param_pos[ident] = n
            key.append(n)
        return tuple(key)

    def _declare(self, bucket, device, buf):
        """The bucket as lowrank takes it (_Bucket: its buffer, ids and shapes, the declaration's
        array, made again only when one of them changes), recorded for this step."""
        index = bucket.index()
        pkey = self._param_key(bucket)  # numbers the parameters from DDP's first step on
        shapes = tuple(tuple(g.shape) for g in bucket.gradients())
        if self._adaptive is not None and not self._step:  # the step's first bucket
            self._adapt()
        ranks, ruled = self._ranks_of(pkey, shapes)
        if sum(_numel(s) for s in shapes) != buf.numel():
            raise InvalidArgumentError(4, f"bucket {index}: its gradients have "
                                          f"{sum(_numel(s) for s in shapes)} elements, its buffer "
                                          f"{buf.numel()}", "powerSGD_hook")
        ptr = buf.data_ptr()
        now = self._step.get(index)
        if now is not None and (now.device, now.ptr) != (device, ptr):
            raise LowrankError(5, f"bucket {index} came twice in one step with other buffers: one "
                                  "PowerSGDState serves one DDP model (make one per model)",
                               "powerSGD_hook")
        b = self._buckets.get(index)
        if b is None or (b.device, b.ptr, b.pkey, b.grad_shapes, b.ranks) != \
                (device, ptr, pkey, shapes, ranks):
            # zero-element tensors take no room in the buffer: not declared
            kept = [(n, _declared_shape(s), k) for n, s, k in zip(pkey, shapes, ranks) if _numel(s)]
            b = _Bucket(device, ptr, buf, pkey, shapes, tuple(n for n, _, _ in kept),
                        tuple(s for _, s, _ in kept), tensor_array(kept), ranks)
        self._step[index] = b
        self._unclaimed.difference_update(b.ids)
        if self._adaptive is not None:  # every step adds to the window's sums; the last measures
            self._measure[(device, ptr)] = (self.iter, b.ids, b.shapes, ruled,
                                            self._adaptive.measures(self.iter))
        return b

    def _set_ranks(self, pkey):
        """Each id's approxRank as exclude and rank_of set it (-1: the default), resolved
        against the parameters as they are at the first step after the settings (a model moved
        to its device after the state was made still matches)."""
        if self._ranks.empty:
            return (-1,) * len(pkey)
        if self._ident_rank is None:
            self._ident_rank = self._ranks.resolve()
        if self._rank_by_id is None or len(self._rank_by_id) != len(self._param_pos):
            self._rank_by_id = {n: self._ident_rank.get(ident, -1)
                                for ident, n in self._param_pos.items()}
        return tuple(self._rank_by_id[n] for n in pkey)

    def _ranks_of(self, pkey, shapes):
        """(each id's approxRank (lowrank's: -1 default, 0 exact, or its own k) for the ids of
        pkey (gradient shapes `shapes`), the ids an adaptive rank rules (_ruled; empty without
        one)): _set_ranks, with the rule's k for the ids it rules."""
        ranks = self._set_ranks(pkey)
        if self._adaptive is None:
            return ranks, frozenset()
        ruled = frozenset(n for n, k, s in zip(pkey, ranks, shapes) if _ruled(k, s))
        first = self._adaptive.initial()
        return tuple(self._adaptive_k.get(n, first) if n in ruled else k
                     for n, k in zip(pkey, ranks)), ruled

    def _adapt(self):
        """At the first bucket of a step that decides (AdaptiveRank.decides): the numbers the
        jobs measured at the decided step (waited for), summed over the process group's ranks
        (one small all_reduce, the same on every rank at this step), turned into each
        parameter's gradient norm and compression error, and the rule's ks taken for this
        step's declarations."""
        m = self._adaptive.decides(self.iter)
        if m is None:
            return
        for worker in self._workers.values():
            worker.drain()  # the measuring jobs of step m have run (on the host, long since)
        local = self._signals.pop(m, {})
        for old in [s for s in self._signals if s < m]:
            del self._signals[old]
        self._adaptive_k.update(self._adaptive.decide(combine(local, self.process_group), step=m))

    def _take_restores(self, device):
        """Actions for the next job on `device`: stage the loaded states meant for it (format 2:
        saved there; format 1: any device) in lowrank, each through a scratch buffer of its own
        declared with the saved ids (restore_state; a failure goes to the `errors` list each
        action takes)."""
        mine = [e for e in self._restores if e.device in (None, _kind(device))]
        if not mine:
            return []
        self._restores = [e for e in self._restores if e not in mine]
        comm, actions = self._comms[device], []
        for e in mine:
            scratch = torch.empty(1)  # an address of its own, never allreduced
            self._scratch.append((device, scratch))
            actions.append(functools.partial(_stage, comm, scratch, e))
        return actions

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
            logger.warning("lowrank: the saved states of %d tensors were not used by the first "
                           "step after loading (no bucket has those parameters: another model or "
                           "other DDP arguments?); those parameters started afresh. Unused ids: "
                           "%s", len(self._unclaimed), _ids_text(self._unclaimed))
        self._buckets, self._step, self._scratch = self._step, {}, []
        self._loaded, self._expect, self._unclaimed = None, {}, set()
        for dev in {dev for dev, _ in stale}:
            comm = self._comms[dev]
            bufs = [(ptr, buf) for (d, ptr), buf in stale.items() if d == dev]
            self._workers[dev].submit(functools.partial(_release, comm, bufs))


def _check_settings(kw):
    """PowerSGDState's arguments checked under their own names before anything is made, in
    lowrank's ranges (lowrank.h, lowrankConfig_t), so that a bad one is not reported later in the
    C API's terms or silently truncated: TypeError for a value of the wrong type (2.7 or True
    where an int is needed, a string where a number is), ValueError for a value out of range.
    kw is updated with plain Python types (the state_dict holds them: a checkpoint loads with
    torch.load(weights_only=True)); a timeout may be a datetime.timedelta (as torch.distributed's),
    kept as seconds."""
    def integer(name, lo, hi):
        try:
            v = as_int(kw[name])
        except TypeError:
            raise TypeError(f"PowerSGDState: {name} must be an int, not {kw[name]!r}") from None
        if not lo <= v <= hi:
            raise ValueError(f"PowerSGDState: {name}={v} is out of range [{lo}, {hi}]")
        kw[name] = v

    def number(name, lo, what):
        v = kw[name]
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"PowerSGDState: {name} must be a number, not {v!r}")
        v = float(v)
        if not math.isfinite(v) or not (v > lo if what == ">" else v >= lo):
            raise ValueError(f"PowerSGDState: {name} must be a finite number {what} {lo}, not {v!r}")
        kw[name] = v

    def flag(name, allow_none=False):
        v = kw[name]
        if v is None and allow_none:
            return
        numpy_bool = type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool")
        if isinstance(v, bool) or numpy_bool or \
                isinstance(v, numbers.Integral) and v in (0, 1):
            kw[name] = bool(v)
            return
        raise TypeError(f"PowerSGDState: {name} must be True or False{' or None' if allow_none else ''}, "
                        f"not {v!r}")
    integer("matrix_approximation_rank", 0, 1 << 16)
    integer("start_powerSGD_iter", 0, 1 << 30)
    integer("random_seed", 0, 2**63 - 1)
    integer("compression_stats_logging_frequency", -2**63, 2**63 - 1)
    number("min_compression_rate", 1, ">=")
    number("orthogonalization_epsilon", 0, ">=")
    if isinstance(kw.get("timeout"), datetime.timedelta):
        kw["timeout"] = kw["timeout"].total_seconds()
    if kw.get("timeout") is not None:
        number("timeout", 0, ">")
    for name in ("use_error_feedback", "warm_start", "batch_tensors_with_same_shape"):
        flag(name)
    flag("pipeline", allow_none=True)


class _Measured:
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


def _ruled(k, shape):
    """Whether an adaptive rank rules a parameter: left to the default by exclude and rank_of
    (k == -1) and a matrix (2 or more dimensions; 1-D parameters are always exact)."""
    return k == -1 and len(shape) >= 2


_FORMAT, _VERSION = "lowrank.torch.PowerSGDState", 2
_CHECKED = ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
            "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed")
_OPTIONS = ("compression_stats_logging_frequency", "batch_tensors_with_same_shape", "timeout",
            "pipeline")

# A bucket as lowrank last took it: pkey and grad_shapes as DDP gave them, ids and shapes as
# declared (array: the declaration, lowrank.tensor_array), buf held until its release.
# ranks: each parameter's approxRank as declared (PowerSGDState._ranks_of).
def _comm_key(device):
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


def _kind(key):
    """"cpu" or "cuda": a communicator key's kind of device (what a state_dict records)."""
    return key.split(":")[0]


_Bucket = collections.namedtuple("_Bucket", "device ptr buf pkey grad_shapes ids shapes array ranks")
# A saved bucket of a state_dict: device None for version 1 (saved before devices were recorded).
_Saved = collections.namedtuple("_Saved", "params shapes state device array")


def _check_state_dict(sd):
    """The saved buckets (_Saved) of a state_dict(); ValueError if it is not one."""
    if not isinstance(sd, dict) or sd.get("format") != _FORMAT:
        raise ValueError("PowerSGDState.load_state_dict: not a state_dict() of "
                         "lowrank.torch.PowerSGDState")
    if sd.get("version") not in (1, _VERSION):
        raise ValueError(f"PowerSGDState.load_state_dict: format version {sd.get('version')!r}, "
                         f"this lowrank reads versions 1 and {_VERSION}")
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
    entries, ids = [], set()
    for n, b in enumerate(sd["buckets"]):
        try:
            params = tuple(int(p) for p in b["params"])
            shapes = tuple(tuple(int(d) for d in s) for s in b["shapes"])
            state = b["state"]  # None: nothing saved (version 1's warm-up checkpoints)
            device = b["device"] if sd["version"] >= 2 else None
            ok = (state is None or isinstance(state, (bytes, bytearray))) and \
                len(params) == len(shapes) > 0 and device in (None, "cpu", "cuda") and \
                not ids & set(params)
            array = tensor_array(zip(params, shapes)) if ok else None
        except (TypeError, ValueError, KeyError, InvalidArgumentError):
            ok = False
        if not ok:
            raise ValueError(f"PowerSGDState.load_state_dict: buckets[{n}] is not a saved bucket "
                             "(params, shapes, state bytes; each id once)")
        ids |= set(params)
        if state is not None:
            state = bytes(state)
            if sd["version"] == 1:
                state = _v1_calls_with_warmup(state, sd["config"]["start_powerSGD_iter"])
        entries.append(_Saved(params, shapes, state, device, array))
    return entries


def _v1_calls_with_warmup(data, start):
    """Version 1's bytes (format 1) count the calls since compression started: that hook did its
    warm-up over the process group. lowrank's per-id warm-up counts every call: the saved count
    plus the warm-up's `start` steps (the u64 at byte 48, little-endian), under a new CRC-32
    (zlib's, the last 4 bytes). Bytes that are not whole format-1 ones are left to lowrank's
    restore to refuse."""
    if (len(data) < 60 or data[:8] != b"LRSTATE\0" or data[8:12] != (1).to_bytes(4, "little")
            or zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "little") or not start):
        return data
    calls = int.from_bytes(data[48:56], "little") + int(start)
    body = data[:48] + calls.to_bytes(8, "little") + data[56:-4]
    return body + zlib.crc32(body).to_bytes(4, "little")


def _same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return a == b


def _numbering_message(clashes):
    """clashes: (id, this parameter's shape, the saved shape)."""
    what = "; ".join(f"id {n}: this model's parameter {tuple(s)}, saved {tuple(w)}"
                     for n, s, w in clashes[:5])
    return (f"the parameters are numbered otherwise than in the run that saved ({what}): DDP's "
            "first step handed them in another order (find_unused_parameters with another "
            "bucket_cap_mb, or another model); resume with the DDP arguments that saved, or "
            "without the hook's state")


def _ids_text(ids):
    ids = sorted(ids)
    return ", ".join(str(i) for i in ids[:20]) + (f", ... ({len(ids)} in all)" if len(ids) > 20
                                                  else "")


def _save_or_none(comm, ptr):
    """comm.save_state(ptr), None where the buffer holds no state (never called compressibly)."""
    try:
        return comm.save_state(ptr)
    except LowrankError as e:
        if e.code == 5 and not comm.view(ptr)["planned"]:
            return None
        raise


def _stage(comm, scratch, saved, errors):
    """Stage a saved bucket's states in lowrank (on the worker): the scratch buffer declared with
    its ids, then restore_state (format 2: each id's state; format 1: converted into them)."""
    try:
        comm.set_tensors(scratch, saved.array)
        comm.restore_state(scratch, saved.state)
    except LowrankError as e:  # the allreduce still runs: the other ranks' check fails too
        errors.append(e)


def _release(comm, bufs):
    """A worker job: release the buffers (held until now, so no other buffer took the address)."""
    for ptr, _ in bufs:
        try:
            comm.release(ptr)
        except LowrankError as e:  # a failed communicator: the next call says so
            logger.debug("lowrank: release of %#x: %s", ptr, e)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _declared_shape(shape):
    """A gradient's shape as declared to lowrank: a 0-dim tensor as (1,), more than 8 dimensions
    as (shape[0], the rest) (the same matrix view)."""
    shape = tuple(shape)
    if not shape:
        return (1,)
    return shape if len(shape) <= 8 else (shape[0], _numel(shape[1:]))


def powerSGD_hook(state, bucket):
    """DDP communication hook: the bucket's gradients averaged over the process group's ranks,
    compressed by lowrank's PowerSGD (per tensor; the bucket's buffer declared with its
    parameters' ids and its gradients' shapes at every call, lowrank.Communicator.set_tensors),
    exact during each parameter's warm-up.

    state: a PowerSGDState. bucket: DDP's GradBucket (or any object with index(), buffer(),
    gradients() and is_last(); parameters() if it has it). Returns a torch.futures.Future of the
    bucket's buffer, reduced in place: completed by the communicator's own thread, so backward
    goes on meanwhile; CUDA buckets are queued on the autograd thread (the call only queues device
    work) on a side stream forked from the current one, and the future carries that dependency.
    Raises TypeError (a state that is not lowrank's PowerSGDState, e.g. PyTorch's),
    InvalidArgumentError (a non-contiguous or mixed-device bucket, an unsupported dtype),
    LowrankError (a closed state; a bucket index twice in a step with other buffers; a numbering
    that differs from a loaded state's); the future completes with LowrankError when lowrank fails
    (a dead peer, ranks whose buckets differ, a restored state that does not fit or that not
    every rank restored: lowrankInvalidUsage on every rank)."""
    if not isinstance(state, PowerSGDState):
        raise TypeError(f"lowrank.torch.powerSGD_hook takes a lowrank.torch.PowerSGDState, not "
                        f"{type(state).__module__}.{type(state).__qualname__}: make the state "
                        "with lowrank.torch.PowerSGDState (PyTorch's arguments)")
    buf = bucket.buffer()
    describe(buf, f"bucket {bucket.index()}'s buffer", "powerSGD_hook")  # cpu or cuda, dense
    for g in bucket.gradients():
        if g.device != buf.device:
            raise InvalidArgumentError(4, f"bucket {bucket.index()} mixes devices: a gradient on "
                                          f"{g.device}, the buffer on {buf.device}", "powerSGD_hook")
    device = _comm_key(buf.device)
    comm = state._comm(device)
    decl = state._declare(bucket, device, buf)
    setup = state._take_restores(device)
    state.maybe_increase_iter(bucket)
    if device != "cpu":
        fut = _reduce_cuda(state, bucket.index(), comm, decl, setup, buf)
    else:
        fut = torch.futures.Future()
        state._workers[device].submit(functools.partial(_reduce, comm, decl, setup, buf, None), fut)
    if bucket.is_last():
        state._end_of_step()  # queued after this step's jobs
    _maybe_log_stats(state)
    # torch's Future.set_exception stores the exception as the value (a Python-side unwrap), which
    # DDP's C++ reads as "Unable to cast ... to Tensor"; re-raised inside then(), it becomes the
    # child future's error, and backward raises RuntimeError with lowrank's message.
    return fut.then(_value)


def _reduce(comm, decl, setup, buf, stream):
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


def _reduce_cuda(state, index, comm, decl, setup, buf):
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
            result = _reduce(comm, decl, setup, buf, side)
        except BaseException as e:  # noqa: B902 - every failure goes to the future
            fut.set_exception(e)
            return fut
        buf.record_stream(side)
        fut.set_result(result)  # records its event on the side stream (current here)
    return fut


def _value(fut):
    return fut.wait()


def _maybe_log_stats(state):
    if state.iter < state.next_stats_report or not logger.isEnabledFor(logging.INFO):
        return
    rate, before, after = state.compression_stats()
    logger.info("lowrank: step %d, compression rate %.1f, %d elements before, %d after",
                state.iter, rate, before, after)
    state.next_stats_report = state.iter + state.compression_stats_logging_frequency
