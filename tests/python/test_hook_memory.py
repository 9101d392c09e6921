"""The framework's memory on the hook's side without a GPU (issue 41): the CUDA communicator of a
PowerSGDState takes its device memory from torch's caching allocator (memory.TorchAllocator,
through Communicator.set_allocator), allocated on the stream lowrank gives it (the bucket's side
stream) and given back with record_stream; an allocator's error (torch's out-of-memory) is what
the call raises, through lowrank's C callbacks; and stats() reports each bucket's bytes.
torch's CUDA tensors, streams and lowrank's device path are stand-ins here, as in
test_hook_cuda_order.py; tests/gpu/test_cuda_memory.cc holds the C side on the emulation."""
import contextlib
import ctypes

import pytest
import torch

from lowrank import LowrankError
from lowrank.comm import Communicator
from lowrank.torch import execution, hook, memory

_SIDE = 0x5eed  # the cudaStream_t lowrank passes (the bucket's side stream)


class _Stream:
    def __init__(self, handle, device=None):
        self.handle, self.device = handle, device


class _Held(torch.Tensor):
    """A CPU uint8 tensor standing in for a CUDA one: its record_stream calls recorded."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    def record_stream(self, stream):
        self.recorded.append(stream.handle)


@pytest.fixture
def fake_torch_cuda(monkeypatch):
    """torch.empty on a CUDA device gives a _Held (its stream and device logged), or raises
    `oom[0]` when set; ExternalStream and torch.cuda.stream recorded."""
    log, oom, current = [], [None], []
    real_empty = torch.empty

    def empty(n, dtype=None, device=None):
        log.append(("empty", n, dtype, str(device), current[-1] if current else None))
        if oom[0] is not None:
            raise oom[0]
        t = real_empty(n, dtype=dtype).as_subclass(_Held)
        t.recorded = []
        return t

    @contextlib.contextmanager
    def stream(s):
        current.append(s.handle)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "ExternalStream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    return log, oom


def test_torch_allocator_allocates_on_the_calls_stream_and_frees_with_record_stream(fake_torch_cuda):
    log, _ = fake_torch_cuda
    a = memory.TorchAllocator("cuda:0")
    address = a.alloc(4096, _SIDE)
    assert log == [("empty", 4096, torch.uint8, "cuda:0", _SIDE)], \
        "a uint8 tensor of the bytes asked for, allocated while the side stream is current"
    assert a.held_bytes == 4096
    held = a._held[address]
    a.free(address, 0xfeed)
    assert held.recorded == [0xfeed], "marked as used on lowrank's stream before it is dropped"
    assert a.held_bytes == 0 and not a._held


class _FakeLib:
    """liblowrank as far as set_allocator and a planning allreduce go: the allreduce calls the
    registered C callbacks as lowrank does (alloc for the planning call's stream; on a refusal,
    free of what it took and lowrankSystemError)."""
    lowrank_path = "fake liblowrank"

    def __init__(self):
        self.alloc = self.free = None
        self.freed = []

    def lowrankCommSetAllocator(self, comm, alloc, free, user):
        self.alloc, self.free = alloc, free
        return 0

    def lowrankAllReduce(self, *args):
        taken = []
        for _ in range(2):
            out = ctypes.c_void_p()
            if self.alloc(ctypes.byref(out), 256, _SIDE, None):
                for p in taken:
                    self.free(p, _SIDE, None)
                    self.freed.append(p)
                return 2
            taken.append(out.value)
        return 0

    def lowrankGetLastError(self, comm):
        return b"buffer 0x10: this comm rank's supplied allocator could not give the memory"

    def lowrankGetErrorString(self, code):
        return b"lowrankSystemError"


def _fake_comm():
    comm = Communicator.__new__(Communicator)  # no C communicator: the fake library's calls
    comm._lib, comm._handle = _FakeLib(), 1
    import threading
    comm._lock, comm._err_lock, comm._aborting = threading.Lock(), threading.Lock(), False
    comm._allocator, comm._alloc_error = None, None
    return comm


def test_an_out_of_memory_of_torch_is_what_the_call_raises(fake_torch_cuda):
    """Through lowrank's C callbacks (ctypes): torch's OutOfMemoryError at the second allocation
    is raised by the allreduce, chained from lowrank's error, and the first is given back."""
    _, oom = fake_torch_cuda
    comm = _fake_comm()
    a = memory.use_torch_memory(comm, "cuda:0")
    assert isinstance(a, memory.TorchAllocator)
    assert comm._call("lowrankAllReduce") is None and a.held_bytes == 512
    error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)("CUDA out of memory. Tried ...")
    allocs = []
    real_alloc = a.alloc

    def second_fails(n, s):
        allocs.append(n)
        oom[0] = error if len(allocs) == 2 else None
        return real_alloc(n, s)

    comm._lib.alloc = None  # registered again, over the failing one
    comm.set_allocator(second_fails, a.free)
    with pytest.raises(type(error)) as caught:
        comm._call("lowrankAllReduce")
    assert caught.value is error, "torch's own error, not lowrank's"
    assert isinstance(caught.value.__cause__, LowrankError)
    assert "supplied allocator" in str(caught.value.__cause__)
    assert len(comm._lib.freed) == 1 and a.held_bytes == 512, "the first block came back"
    oom[0] = None
    assert comm._call("lowrankAllReduce") is None, "the next call goes on (no stale error)"


def test_set_allocator_takes_both_or_neither():
    comm = _fake_comm()
    with pytest.raises(TypeError):
        comm.set_allocator(lambda n, s: 0, None)
    comm.set_allocator(None, None)
    assert not comm._lib.alloc and not comm._lib.free, "null functions: lowrank's own"


class _RecordingComm:
    def __init__(self, device):
        self.device, self._lib, self.allocators = device, _FakeLib(), []

    def set_allocator(self, alloc, free):
        self.allocators.append((alloc, free))

    def destroy(self):
        pass


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_hooks_cuda_communicator_takes_torchs_memory(one_rank_group, monkeypatch):
    """A PowerSGDState's CUDA communicator is given a TorchAllocator's pair when it is made; its
    host communicator none."""
    made = {}

    def communicator(group, device, **config):
        made[device] = _RecordingComm(device)
        return made[device]

    monkeypatch.setattr(execution, "communicator_from_process_group", communicator)
    # no CUDA here: "cuda" is the current device, 0; making its communicator on it a no-op
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    state = hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=1,
                               device="cpu")
    try:
        state.communicator("cuda")
        assert made["cpu"].allocators == [], "host buffers take no device allocator"
        (alloc, free), = made["cuda"].allocators
        assert isinstance(alloc.__self__, memory.TorchAllocator) and free.__self__ is alloc.__self__
        assert alloc.__self__.device == torch.device("cuda:0")
    finally:
        state.close()


def test_stats_report_each_buckets_memory(one_rank_group):
    """stats()["memory"]: per bucket of the last step, the bytes lowrank reports for its buffer
    (a real host communicator: residual, factors and payload; their sum the counters' stateBytes)."""
    from test_hook_cuda_order import _GradBucket
    state = hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=0,
                               device="cpu")
    try:
        model = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.Linear(24, 4))
        bucket = _GradBucket(3, list(model.parameters()), last=True, cuda=False)
        hook.powerSGD_hook(state, bucket).wait()
        st = state.stats()
        assert set(st["memory"]) == {3}
        m = st["memory"][3]
        assert m == state.communicator("cpu").memory(bucket.buffer())
        assert m["planned"] == 1 and m["device"] == 0
        assert m["residualBytes"] == 4 * bucket.buffer().numel()
        assert m["totalBytes"] == st["stateBytes"] > m["residualBytes"]
    finally:
        state.close()
