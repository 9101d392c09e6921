"""PowerSGDState and powerSGD_hook: PyTorch's DDP PowerSGD hook, with lowrank doing the work.

The arguments and their defaults are those of PyTorch's
torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState; differences are listed
in each argument's description and in docs/pytorch.md. Method: PowerSGD (Vogels, Karimireddy,
Jaggi, NeurIPS 2019, arXiv 1905.13727), per tensor as PyTorch's hook: each gradient of >= 2
dimensions viewed as (shape[0], -1) and compressed if (n + m) k rate < n m, the rest exact.
Each bucket is handed to lowrank as it is: its buffer, declared with its parameters' ids
(lowrankBufferSetTensors), so that the state (residual, warm-start Q, warm-up count) belongs to
the parameters and follows them through DDP's bucket rebuilds and restarts.
The parts: settings.py (the arguments' checks), numbering.py (tensor ids, per-parameter and
adaptive ranks), checkpoint.py (state_dict and its loading), execution.py (a step's jobs).
"""
import atexit
import functools
import logging

import torch
import torch.distributed as dist

from .._buffers import describe
from ..errors import InvalidArgumentError, LowrankError
from .adaptive import AdaptiveRank
from .checkpoint import Checkpoint
from .execution import Runtime, comm_key, log_stats, reduce, reduce_cuda
from .numbering import Numbering
from .process_group import require_initialized
from .settings import CHECKED, OPTIONS, check_settings, communicator_config
from .tensor_ranks import TensorRanks

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


class PowerSGDState(Numbering, Checkpoint, Runtime):
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
      alternate (False): alternating PowerSGD (ACP-SGD: Zhang, Zhang, Shi, Chu, Li, "Evaluation
        and Optimization of Gradient Compression for Distributed Deep Learning", ICDCS 2023):
        each compressed step computes one factor against the other kept from the step before
        and allreduces it, P at one step and Q at the next (P first), so a step makes one
        factor allreduce of n k (P) or m k (Q) floats per (n x m) tensor instead of PowerSGD's
        two dependent ones of (n + m) k together. Error feedback, warm-up, the compression
        test and exact tensors are as PowerSGD's (docs/design.md, "Alternating factors").
        lowrankConfig_t.alternate; the hook's value wins over LOWRANK_ALTERNATE. Needs
        warm_start=True (ValueError naming both otherwise). CUDA buckets too (tested on the
        CPU emulation of CUDA only, not yet on a GPU). Not checked by
        load_state_dict: a state saved under either schedule loads under the other (lowrank
        keeps each tensor's residual and warm-start Q; into alternate=True the alternation
        starts with a P step), one saved alternating goes on at its saved phase, and a
        state_dict saved before this option loads too (see state_dict, "options").
      factor_dtype ("fp32"): the dtype PowerSGD's factors P and Q travel in: "fp32", "bf16" or
        "fp16" ("float32", "bfloat16", "float16" and torch.float32, torch.bfloat16,
        torch.float16 name the same); None: LOWRANK_FACTOR_DTYPE's (default fp32). "bf16" and
        "fp16" halve the factor bytes of every compressed step (the exact part, the 1-D
        tensors and the warm-up stay float32): the host transport (CPU buckets) rounds each
        factor send once to 16 bits and sums in float32 (docs/design.md, "16-bit factors");
        CUDA buckets: as lowrankConfig_t.factorDtype says (tested on CPU buckets only). The
        residual and warm-start Q lowrank keeps are float32, and each residual is taken
        against the factors as they arrived, so error feedback keeps what the wire drops.
        lowrankConfig_t.factorDtype; the hook's value (its default too) wins over
        LOWRANK_FACTOR_DTYPE. Every rank must give the same:
        ranks that differ all raise lowrankInvalidUsage naming the factor dtype at the first
        compressed step, none hangs. Not checked by load_state_dict: the state does not depend
        on it, so a state saved with one factor dtype loads with another (state_dict, "options";
        one saved before this option loads as "fp32" when unpickled). A library older than the
        option refuses "bf16" and "fp16" (LowrankError naming 16-bit factors).
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
    matrix_approximation_rank in [0, 65536], min_compression_rate >= 1, a flag that is not a
    bool, ...), for alternate=True with warm_start=False, for a factor_dtype not among those
    above (ValueError; TypeError for one that is neither a string nor a torch.dtype), and for
    bad exclude, rank_of or model (each named).
    Thread safety: one state serves one DDP model; its hook is called by DDP's autograd thread.

    The ids: every parameter is numbered in the order DDP first hands it to the hook in the
    process (see state_dict, "the ids"). Checkpoint (docs/pytorch.md, "Checkpoint"): state_dict()
    / load_state_dict(sd), or pickling the state (torch.save(state)); every rank saves and loads
    its own, with the model and the optimizer."""

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0,
                 compression_stats_logging_frequency=10_000, batch_tensors_with_same_shape=False,
                 *, timeout=None, pipeline=None, alternate=False, factor_dtype="fp32",
                 device=None, exclude=None, rank_of=None, model=None, adaptive=None):
        settings = {k: v for k, v in locals().items() if k in CHECKED + OPTIONS}
        check_settings(settings)  # these and the next checked before anything is made
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
        """The arguments of __init__ (kw: by name, checked by check_settings) and an empty
        runtime: no communicator yet."""
        self.process_group = process_group
        for k in CHECKED + ("batch_tensors_with_same_shape",):
            setattr(self, k, kw[k])
        self.compression_stats_logging_frequency = max(1, kw["compression_stats_logging_frequency"])
        self.iter = self.next_stats_report = 0
        self._timeout, self._pipeline = kw["timeout"], kw["pipeline"]
        self._alternate, self._factor_dtype = kw["alternate"], kw["factor_dtype"]
        self._config = communicator_config(kw)  # lowrank's per-id warm-up is start_powerSGD_iter
        self._comms = {}    # "cpu" / "cuda:N" (comm_key) -> Communicator
        self._workers = {}  # the same keys -> Worker
        self._side_streams = {}  # (device, bucket index) -> torch.cuda.Stream (CUDA buckets)
        self._buckets = {}  # bucket index -> Bucket: the last complete step's
        self._step = {}     # bucket index -> Bucket: the current step's
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
        # A loaded state_dict: its entries (Saved) wait for the next job on their device, which
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

    def communicator(self, device="cpu"):
        """The lowrank.Communicator this state uses for buckets on `device` (made if needed:
        collective over process_group, as the constructor)."""
        self._comm(device)
        return self._comms[comm_key(device)]

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

    def _check_open(self, what):
        if self._closed:
            raise LowrankError(5, "this PowerSGDState was closed: make a new one", what)


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
    device = comm_key(buf.device)
    comm = state._comm(device)
    decl = state._declare(bucket, device, buf)
    setup = state._take_restores(device)
    state.maybe_increase_iter(bucket)
    if device != "cpu":
        fut = reduce_cuda(state, bucket.index(), comm, decl, setup, buf)
    else:
        fut = torch.futures.Future()
        state._workers[device].submit(functools.partial(reduce, comm, decl, setup, buf, None), fut)
    if bucket.is_last():
        state._end_of_step()  # queued after this step's jobs
    log_stats(state)
    # torch's Future.set_exception stores the exception as the value (a Python-side unwrap), which
    # DDP's C++ reads as "Unable to cast ... to Tensor"; re-raised inside then(), it becomes the
    # child future's error, and backward raises RuntimeError with lowrank's message.
    return fut.then(torch.futures.Future.wait)


