"""The hook's CUDA path without a GPU (issue 26, item 3): torch's CUDA streams and futures and the
communicator replaced by recording stand-ins, so that what the hook does with them shows. A CUDA
bucket is reduced inline, on the thread that called the hook (DDP's autograd thread), in the
order of the calls, on a side stream of the bucket's that first waits for the current stream; a
failure completes the future instead of raising; and through powerSGD_hook itself, as DDP calls it,
with a real PowerSGDState (issue 39): a CUDA bucket goes inline, a CPU bucket to its worker.
tests/python/test_cuda.py runs the real thing where a device is present."""
import contextlib
import functools
import threading
import types
import typing

import pytest
import torch

from lowrank import LowrankError
from lowrank.torch import execution, hook

_REAL_FUTURE = torch.futures.Future  # before any test replaces it
_T = typing.TypeVar("_T")


class _Stream:
    def __init__(self, name, log):
        self.name, self._log = name, log

    def wait_stream(self, other):
        self._log.append(("wait", self.name, other.name))


class _Future:
    def __init__(self, devices=None):
        self.devices, self.value, self.error = devices, None, None

    def set_result(self, value):
        self.value = value

    def set_exception(self, error):
        self.error = error


class _Buffer:
    def __init__(self, tag):
        self.tag, self.device, self.recorded = tag, "cuda:0", []

    def record_stream(self, stream):
        self.recorded.append(stream.name)


class _Comm:
    def __init__(self, log, fail_on=None):
        self._log, self._fail_on = log, fail_on

    def set_tensors(self, buf, array):
        self._log.append(("declare", buf.tag))

    def allreduce(self, buf, op, stream):
        self._log.append(("allreduce", buf.tag, stream.name, threading.get_ident()))
        if buf.tag == self._fail_on:
            raise LowrankError(2, "a peer died", "lowrankAllReduce")


@pytest.fixture
def fake_cuda(monkeypatch):
    log = []
    current = _Stream("current", log)
    made = []

    def stream(device=None):
        made.append(_Stream(f"side{len(made)}", log))
        return made[-1]

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.futures, "Future", _Future)
    state = types.SimpleNamespace(_side_streams={})
    state._side_stream = functools.partial(hook.PowerSGDState._side_stream, state)
    return state, log


def _decl():
    return types.SimpleNamespace(array=None)


def test_cuda_buckets_are_reduced_inline_in_call_order_on_side_streams(fake_cuda):
    state, log = fake_cuda
    comm = _Comm(log)
    futures = [execution.reduce_cuda(state, i, comm, _decl(), [], _Buffer(f"b{i}"))
               for i in (0, 1, 0)]
    calls = [e for e in log if e[0] == "allreduce"]
    assert [c[1] for c in calls] == ["b0", "b1", "b0"], "in the order DDP called the hook"
    assert {c[3] for c in calls} == {threading.get_ident()}, "on the calling thread, not a worker"
    assert [c[2] for c in calls] == ["side0", "side1", "side0"], "one side stream per bucket"
    for c in calls:  # each call's side stream waited for the current stream just before it
        i = log.index(c)
        assert log[i - 2] == ("wait", c[2], "current") and log[i - 1] == ("declare", c[1])
    assert all(f.error is None and f.value is not None for f in futures)
    assert futures[0].devices == ["cuda:0"]
    assert futures[1].value.recorded == ["side1"], "the buffer is recorded on its side stream"


def test_a_failed_cuda_call_completes_the_future_with_the_error(fake_cuda):
    state, log = fake_cuda
    fut = execution.reduce_cuda(state, 0, _Comm(log, fail_on="b0"), _decl(), [], _Buffer("b0"))
    assert isinstance(fut.error, LowrankError) and "a peer died" in str(fut.error)
    assert fut.value is None


def test_a_failed_restore_staging_is_the_error_after_the_allreduce(fake_cuda):
    state, log = fake_cuda
    staged = RuntimeError("this rank's restore failed")
    fut = execution.reduce_cuda(state, 0, _Comm(log), _decl(),
                                [lambda errors: errors.append(staged)], _Buffer("b0"))
    assert fut.error is staged
    assert [e[0] for e in log].count("allreduce") == 1, "the allreduce ran: every rank runs it"


class _OnCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device: torch's CUDA tensors cannot exist without a GPU,
    and the hook's dispatch reads only the device (lowrank's C call is the stand-in's)."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", self.index)

    def record_stream(self, stream):
        self.recorded.append(stream.name)


def _on_cuda(t, index=0):
    out = t.as_subclass(_OnCuda)
    out.recorded, out.tag, out.index = [], f"cuda:{index} bucket", index  # tag: for _Comm's log
    return out


class _GradBucket:
    """DDP's GradBucket as the hook reads it: index(), buffer(), gradients() (views of the
    buffer), parameters(), is_last()."""

    def __init__(self, index, params, last, cuda):  # cuda: False, True (cuda:0) or an index > 0
        self._index, self._params, self._last = index, params, last
        flat = torch.cat([torch.randn(p.numel()) for p in params])
        self._buf, offset, self._grads = flat, 0, []
        for p in params:
            self._grads.append(flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        if cuda:
            dev = 0 if cuda is True else cuda
            self._buf = _on_cuda(flat, dev)
            self._grads = [_on_cuda(g, dev) for g in self._grads]

    def index(self):
        return self._index

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._grads

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last


@pytest.fixture
def hook_state(fake_cuda, monkeypatch):
    """A real PowerSGDState over a one-rank gloo group (its host communicator real); its CUDA
    communicator the recording stand-in; torch's Future real, its devices recorded."""
    import torch.distributed as dist
    from lowrank.torch import PowerSGDState
    _, log = fake_cuda
    made = []

    class Future(_REAL_FUTURE[_T]):  # generic: torch's Future.then() subscripts Future
        def __init__(self, devices=None):
            made.append(devices)
            super().__init__()

    monkeypatch.setattr(torch.futures, "Future", Future)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=1, device="cpu")
    state._comms["cuda:0"] = _Comm(log)
    try:
        yield state, log, made
    finally:
        del state._comms["cuda:0"]  # the stand-in has no worker to close
        state.close()
        dist.destroy_process_group()


def test_the_hook_reduces_a_cuda_bucket_inline_and_a_cpu_bucket_on_its_worker(hook_state):
    """Through powerSGD_hook, as DDP calls it (issue 39, item 4): a bucket on a CUDA device is
    declared and reduced inline, on the calling thread, on its side stream after the current
    stream, and the hook's future (CUDA devices) gives back the buffer; a CPU bucket of the same
    step goes to the host communicator's worker thread (real: a one-rank allreduce)."""
    from lowrank.torch import powerSGD_hook
    state, log, made = hook_state
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4))
    params = list(model.parameters())
    cuda_bucket = _GradBucket(0, params[2:], last=False, cuda=True)
    cpu_bucket = _GradBucket(1, params[:2], last=True, cuda=False)
    fut = powerSGD_hook(state, cuda_bucket)
    calls = [e for e in log if e[0] == "allreduce"]
    assert len(calls) == 1, f"the CUDA bucket was reduced while the hook ran (inline): {log}"
    assert calls[0][2] == "side0" and calls[0][3] == threading.get_ident()
    i = log.index(calls[0])
    assert log[i - 2] == ("wait", "side0", "current"), "its side stream waited for the current one"
    assert made[0] == [torch.device("cuda", 0)], "the future carries the CUDA device"
    assert fut.wait() is cuda_bucket.buffer()
    assert cuda_bucket.buffer().recorded == ["side0"]
    before = cpu_bucket.buffer().clone()
    out = powerSGD_hook(state, cpu_bucket).wait()
    assert [e for e in log if e[0] == "allreduce"] == calls, "the CPU bucket did not go inline"
    assert out is cpu_bucket.buffer() and torch.equal(out, before), "a one-rank mean is the input"


def test_each_cuda_device_has_a_communicator_of_its_own_made_on_it(hook_state, monkeypatch):
    """Issue 41, item 3: a bucket on cuda:1 goes to a communicator of its own, made (collective
    over the group) while cuda:1 is current, since lowrank makes its NCCL communicator on the
    current device; a bucket on cuda:0 of the same step stays with cuda:0's."""
    from lowrank.torch import powerSGD_hook
    state, log, _ = hook_state
    current, made = [0], []

    @contextlib.contextmanager
    def device(d):
        before, current[0] = current[0], torch.device(d).index
        try:
            yield
        finally:
            current[0] = before

    class Made(_Comm):
        def allreduce(self, buf, op, stream):
            self._log.append(("allreduce on cuda:1's", buf.tag))

        def destroy(self):
            pass

    def make(group, kind, **config):
        made.append((kind, current[0]))
        return Made(log)

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(execution, "communicator_from_process_group", make)
    # torch's memory for the stand-ins: tested in test_hook_memory.py, not the point here
    monkeypatch.setattr(execution, "use_torch_memory", lambda comm, device: None)
    params = list(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4)).parameters())
    powerSGD_hook(state, _GradBucket(0, params[2:], last=False, cuda=1)).wait()
    powerSGD_hook(state, _GradBucket(1, params[:2], last=True, cuda=True)).wait()
    assert made == [("cuda", 1)], "one communicator made, for cuda:1, with cuda:1 current"
    assert current == [0], "the caller's device given back"
    assert sorted(k for k in state._comms if k != "cpu") == ["cuda:0", "cuda:1"]
    reduced = [e[:2] for e in log if e[0].startswith("allreduce")]
    assert reduced == [("allreduce on cuda:1's", "cuda:1 bucket"), ("allreduce", "cuda:0 bucket")]
