"""The hook's CUDA path without a GPU (issue 26, item 3): torch's CUDA streams and futures and the
communicator replaced by recording stand-ins, so that what the hook does with them shows. A CUDA
bucket is reduced inline, on the thread that called the hook (DDP's autograd thread), in the
order of the calls, on a side stream of the bucket's that first waits for the current stream; a
failure completes the future instead of raising. tests/python/test_cuda.py runs the real thing
where a device is present."""
import contextlib
import functools
import threading
import types

import pytest
import torch

from lowrank import LowrankError
from lowrank.torch import hook


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
    futures = [hook._reduce_cuda(state, i, comm, _decl(), [], _Buffer(f"b{i}")) for i in (0, 1, 0)]
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
    fut = hook._reduce_cuda(state, 0, _Comm(log, fail_on="b0"), _decl(), [], _Buffer("b0"))
    assert isinstance(fut.error, LowrankError) and "a peer died" in str(fut.error)
    assert fut.value is None


def test_a_failed_restore_staging_is_the_error_after_the_allreduce(fake_cuda):
    state, log = fake_cuda
    staged = RuntimeError("this rank's restore failed")
    fut = hook._reduce_cuda(state, 0, _Comm(log), _decl(), [lambda errors: errors.append(staged)],
                            _Buffer("b0"))
    assert fut.error is staged
    assert [e[0] for e in log].count("allreduce") == 1, "the allreduce ran: every rank runs it"
