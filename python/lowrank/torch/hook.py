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
        start: lowrank resets a bucket's state when DDP rebuilds the buckets.
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
    Thread safety: one state serves one DDP model; its hook is called by DDP's autograd thread."""

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0,
                 compression_stats_logging_frequency=10_000, batch_tensors_with_same_shape=False,
                 *, timeout=None, pipeline=None, device=None):
        require_initialized()
        if start_powerSGD_iter < 0:
            raise ValueError(f"start_powerSGD_iter must be >= 0, not {start_powerSGD_iter}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.iter = 0
        self.next_stats_report = 0
        # start_iter 0: the warm-up is counted here in steps, as PyTorch's (LOWRANK_START_ITER
        # would otherwise add per-buffer calls of its own).
        self._config = dict(approx_rank=matrix_approximation_rank, start_iter=0,
                            min_compression_rate=float(min_compression_rate),
                            error_feedback=bool(use_error_feedback), warm_start=bool(warm_start),
                            ortho_epsilon=float(orthogonalization_epsilon), seed=int(random_seed),
                            timeout=timeout, pipeline=pipeline)
        self._comms = {}    # "cpu" / "cuda" -> Communicator
        self._workers = {}  # the same keys -> Worker
        self._buckets = {}  # bucket index -> (device, buffer address, shapes)
        self._seen = set()  # bucket indices called in the current step
        self._closed = False
        if device is None:
            backend = str(dist.get_backend(process_group)).lower()
            device = "cuda" if backend == "nccl" else "cpu"
        self._comm(device)
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
        """lowrankBufferGetView of a bucket's buffer (dict), None if lowrank never saw it."""
        rec = self._buckets.get(bucket_index)
        if rec is None:
            return None
        dev, ptr, _ = rec
        self._workers[dev].drain()
        return self._comms[dev].view(ptr)

    def communicator(self, device="cpu"):
        """The lowrank.Communicator this state uses for buckets on `device` (made if needed)."""
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
        _live_states.discard(self)

    # ---- internals -----------------------------------------------------------------------------
    def _comm(self, device):
        if self._closed:
            raise LowrankError(5, "this PowerSGDState was closed: make a new one", "powerSGD_hook")
        if device not in self._comms:
            self._comms[device] = communicator_from_process_group(self.process_group, device,
                                                                  **self._config)
            self._workers[device] = Worker(f"lowrank-{device}")
        return self._comms[device]

    def _plan_bucket(self, bucket, buf, device):
        """The layout actions this bucket needs before its allreduce, as a list of callables run
        by the worker (in order): release stale buffers, set a new layout. Records the bucket."""
        comm = self._comms[device]
        shapes = tuple(tuple(g.shape) for g in bucket.gradients())
        if sum(_numel(s) for s in shapes) != buf.numel():
            raise InvalidArgumentError(4, f"bucket {bucket.index()}: its gradients have "
                                          f"{sum(_numel(s) for s in shapes)} elements, its buffer "
                                          f"{buf.numel()}", "powerSGD_hook")
        index, ptr = bucket.index(), buf.data_ptr()
        record = (device, ptr, shapes)
        old = self._buckets.get(index)
        if index in self._seen and old != record:
            raise LowrankError(5, f"bucket {index} came twice in one step with other buffers: one "
                                  "PowerSGDState serves one DDP model (make one per model)",
                               "powerSGD_hook")
        self._seen.add(index)
        if old == record:
            return []
        actions = []
        if old is not None:
            actions += self._release_unless_live(old, exclude=index)
        self._buckets[index] = record
        actions.append(lambda: comm.set_layout(ptr, shapes))
        return actions

    def _release_unless_live(self, rec, exclude):
        """Release rec's buffer unless another live bucket now uses that address."""
        dev, ptr, _ = rec
        if any(r[0] == dev and r[1] == ptr for i, r in self._buckets.items() if i != exclude):
            return []
        comm = self._comms[dev]
        return [lambda: comm.release(ptr)]

    def _end_of_step(self):
        """After the last bucket: release the buffers of buckets DDP no longer has."""
        actions = []
        for index in [i for i in self._buckets if i not in self._seen]:
            rec = self._buckets.pop(index)
            actions += self._release_unless_live(rec, exclude=index)
        self._seen.clear()
        return actions


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
    gradients() and is_last()). Returns a torch.futures.Future of the bucket's buffer, reduced in
    place: completed by the communicator's own thread, so backward goes on meanwhile; for CUDA
    buckets the call is queued on the current stream and the future carries that dependency.
    Raises InvalidArgumentError (a non-contiguous or mixed-device bucket, an unsupported dtype);
    the future completes with LowrankError when lowrank fails (a dead peer, ranks whose buckets
    differ: lowrankInvalidUsage on every rank)."""
    buf = bucket.buffer()
    info = describe(buf, f"bucket {bucket.index()}'s buffer", "powerSGD_hook")
    for g in bucket.gradients():
        if g.device != buf.device:
            raise InvalidArgumentError(4, f"bucket {bucket.index()} mixes devices: a gradient on "
                                          f"{g.device}, the buffer on {buf.device}", "powerSGD_hook")
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _exact_allreduce(state, buf)

    device = info.device
    comm = state._comm(device)
    actions = state._plan_bucket(bucket, buf, device)
    # After the last bucket, the buffers of buckets DDP no longer has (a rebuild) are released.
    after = state._end_of_step() if bucket.is_last() else []
    state.maybe_increase_iter(bucket)
    stream = torch.cuda.current_stream(buf.device) if device == "cuda" else None
    fut = torch.futures.Future(devices=[buf.device]) if device == "cuda" else torch.futures.Future()

    def job():
        for act in actions:
            act()
        comm.allreduce(buf, op="avg", stream=stream)
        for act in after:
            act()
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
