"""The lowrank package over the C API, in one process: comm ranks as threads."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import lowrank
from conftest import ROOT


def on_ranks(n, body, **config):
    """Runs body(comm) on n comm ranks (threads); returns their results, re-raising a failure."""
    uid = lowrank.get_unique_id()
    out, errs = [None] * n, []

    def run(r):
        try:
            with lowrank.Communicator.init_rank(n, uid, r, **config) as c:
                out[r] = body(c)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    if errs:
        raise errs[0]
    return out


def test_numpy_compressed_and_exact():
    """float32 compressed (identical on every rank, a rank-k input reproduced), int64 and
    float64 exact, sum and avg."""
    rng = np.random.default_rng(0)
    # A sum of rank-2 matrices over ranks with a shared column space: rank 2 overall.
    u, v = rng.standard_normal((48, 2)), rng.standard_normal((2, 40))
    mats = [(u @ (v * (r + 1))).astype(np.float32) for r in range(3)]
    ints = [rng.integers(-100, 100, 500) for _ in range(3)]

    def body(c):
        buf = mats[c.rank].reshape(-1).copy()
        c.set_layout(buf, [(48, 40)])
        c.allreduce(buf, op="avg")
        iv = ints[c.rank].copy()
        c.allreduce(iv, op="sum")
        d = np.full(7, float(c.rank))
        c.allreduce(d, op="max")
        return buf, iv, d, c.view(buf), c.stats()
    res = on_ranks(3, body, approx_rank=2, seed=3)
    exact_mean = np.mean(mats, axis=0).reshape(-1)
    for buf, iv, d, view, st in res:
        assert np.array_equal(buf, res[0][0])
        assert np.linalg.norm(buf - exact_mean) / np.linalg.norm(exact_mean) < 1e-4
        assert np.array_equal(iv, np.sum(ints, axis=0))
        assert np.array_equal(d, np.full(7, 2.0))
        assert view["planned"] == 1 and view["perTensor"] == 1 and view["ncompressed"] == 1
        assert st["compressedCalls"] == 1 and st["calls"] == 3


@pytest.mark.parametrize("probe", ["1", "0"])
def test_transport_info_names_what_was_measured(monkeypatch, probe):
    """transport_info(): the links measured when the comm was made (LOWRANK_UCX_PROBE=1), the same
    constants on every comm rank, and the algorithm of each size class used."""
    monkeypatch.setenv("LOWRANK_UCX_PROBE", probe)

    def body(c):
        c.allreduce(np.ones(1000, np.float32), op="sum")
        return c.transport_info()
    infos = on_ranks(2, body)
    for info in infos:
        assert info["transport"] == "ucx"
        assert info["choice"] == ("measured" if probe == "1" else "given")
        assert ("probe" in info) == (probe == "1")
        assert info["algorithms"], info
        assert set(info["algorithms"].values()) <= {"ring", "halving_doubling",
                                                     "recursive_doubling", "direct"}
        for key in ("alpha_us", "overhead_us", "beta_ns_per_byte"):
            assert info[key] == infos[0][key]
    if probe == "1":
        probe_ = infos[0]["probe"]
        assert probe_["partner"] == 1 and probe_["small_rtt_us"] > 0
        # alpha: the round trip of the pair alone (link_probe.h); both printed to 6 significant
        # digits: equal within that rounding
        assert probe_["small_rtt_alone_us"] > 0
        assert infos[0]["alpha_us"] == pytest.approx(probe_["small_rtt_alone_us"] / 2, rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_tensors_compressed(dtype):
    """torch tensors of the three compressed dtypes, out of place, batched mode."""
    g = torch.Generator().manual_seed(1)
    ins = [torch.randn(64, 64, generator=g).to(dtype) for _ in range(2)]

    def body(c):
        out = torch.empty_like(ins[c.rank])
        c.allreduce(ins[c.rank], out)
        return out, c.view(out), c.stats()
    res = on_ranks(2, body, approx_rank=4)
    for out, view, st in res:
        assert out.dtype == dtype and torch.equal(out, res[0][0])
        assert view["planned"] == 1 and view["perTensor"] == 0 and st["compressedCalls"] == 1
    assert torch.isfinite(res[0][0].float()).all()


def test_bad_arguments_raise_and_comm_goes_on():
    """Each bad argument raises InvalidArgumentError (a ValueError) with lowrank's code 4; a bad
    layout is lowrank's own InvalidUsage at the next call; the communicator stays usable."""
    def body(c):
        seen = {}
        x = torch.randn(32, 16)
        for name, call in {
            "non_contiguous": lambda: c.allreduce(x.t()),
            "dtype": lambda: c.allreduce(torch.zeros(4, dtype=torch.complex64)),
            "bool": lambda: c.allreduce(np.zeros(4, dtype=bool)),
            "mixed_device": lambda: c.allreduce(x, torch.empty(32, 16, device="meta")),
            "count": lambda: c.allreduce(x, torch.empty(31, 16)),
            "op": lambda: c.allreduce(x, op="mean"),
            "not_array": lambda: c.allreduce([1.0, 2.0]),
            "zero_size": lambda: c.set_layout(x, [(32, 0, 16)]),
            "shapes_not_sequences": lambda: c.set_layout(x, [512]),
            "read_only": lambda: c.allreduce(np.frombuffer(b"\0" * 64, dtype=np.float32)),
        }.items():
            with pytest.raises(lowrank.InvalidArgumentError) as e:
                call()
            assert e.value.code == 4 and isinstance(e.value, ValueError)
            seen[name] = str(e.value)
        buf = torch.randn(100)
        c.set_layout(buf, [(10, 9)])  # 90 elements for a buffer of 100
        with pytest.raises(lowrank.LowrankError) as e:
            c.allreduce(buf)
        assert e.value.code == 5 and e.value.result == "lowrankInvalidUsage"
        assert e.value.message and e.value.function == "lowrankAllReduce"
        c.set_layout(buf, [(10, 10)])
        c.allreduce(buf)
        return seen, c.stats()
    seen, st = on_ranks(1, body, approx_rank=2)[0]
    assert "contiguous" in seen["non_contiguous"] and "complex64" in seen["dtype"]
    assert "meta" in seen["mixed_device"] and "differ" in seen["count"]
    assert "read-only" in seen["read_only"] and "sequence" in seen["shapes_not_sequences"]
    assert "size" in seen["zero_size"].lower() or "0" in seen["zero_size"]
    assert st["calls"] == 1 and st["buffers"] == 1


def test_set_tensors_bad_arguments():
    """set_tensors refuses malformed tensors with InvalidArgumentError naming the entry, before
    anything reaches the library; tensor_array's result is taken as it is."""
    bad = {
        "not_iterable": 5,
        "empty": [],
        "not_pair": [(1,)],
        "too_long": [(1, (4, 4), 2, 9)],
        "float_id": [(1.5, (4, 4))],
        "negative_id": [(-1, (4, 4))],
        "huge_id": [(2**64, (4, 4))],
        "twice": [(3, (4, 4)), (3, (2,))],
        "no_dims": [(1, ())],
        "nine_dims": [(1, (1,) * 9)],
        "zero_size": [(1, (4, 0))],
        "float_size": [(1, (4, 2.5))],
        "shape_int": [(1, 16)],
        "rank_low": [(1, (4, 4), -2)],
        "rank_high": [(1, (4, 4), 65537)],
        "bool_rank": [(1, (4, 4), True)],
        "bool_id": [(False, (4, 4))],
        "bool_size": [(1, (4, True))],
        "numpy_bool_rank": [(1, (4, 4), np.bool_(True))],
        "tensor_rank": [(1, (4, 4), torch.tensor(2))],
        "set_shape": [(1, {4, 3})],
    }
    seen = {}
    for name, tensors in bad.items():
        with pytest.raises(lowrank.InvalidArgumentError) as e:
            lowrank.tensor_array(tensors)
        assert e.value.code == 4 and e.value.function == "lowrankBufferSetTensors"
        seen[name] = str(e.value)
    assert "tensors[1]" in seen["twice"] and "given twice" in seen["twice"]
    assert "1 to 8" in seen["nine_dims"] and "2^64" in seen["huge_id"]
    assert "65536" in seen["rank_high"] and "no tensors" in seen["empty"]
    ok = lowrank.tensor_array([(0, torch.Size([4, 4])), (2**64 - 1, (3,), 0), (7, (2, 3, 4), None),
                               (8, [5, 5], 65536)])
    assert len(ok) == 4
    a = ok.array
    assert (a[1].id, a[1].ndims, a[1].approxRank) == (2**64 - 1, 1, 0)
    assert (a[2].ndims, list(a[2].shape[:3]), a[2].approxRank) == (3, [2, 3, 4], -1)
    assert a[3].approxRank == 65536


def test_set_tensors_state_follows_the_ids():
    """Tensors declared with ids keep their state across buffers: 3 calls on buffer a, then 2 on
    b (same ids, another address) equal 5 calls on one buffer; the same ids regrouped into two
    buffers equal it too (world 2: a tensor's result does not depend on its neighbours), as does
    a format-2 save_state of a, restored through a scratch address into a fresh communicator's
    regrouped buffers. Every comm rank, bit for bit; warm-up per id (start_iter 1)."""
    g = torch.Generator().manual_seed(9)
    shapes = [(48, 40), (8,), (24, 3, 4)]
    n = sum(int(np.prod(s)) for s in shapes)
    ins = [[torch.randn(n, generator=g) for _ in range(5)] for _ in range(2)]
    tensors = [(101, shapes[0]), (7, shapes[1]), (2**63 + 5, shapes[2])]
    cut = 48 * 40 + 8

    def run(c, plan):
        """plan: per call, 'one' (buffer a), 'moved' (buffer b) or 'split' (two buffers)."""
        a, b = torch.empty(n), torch.empty(n)
        s1, s2 = torch.empty(cut), torch.empty(n - cut)
        outs = []
        for x, how in zip(ins[c.rank], plan):
            if how == "split":
                c.set_tensors(s1, tensors[:2])
                c.set_tensors(s2, tensors[2:])
                s1.copy_(x[:cut]), s2.copy_(x[cut:])
                c.allreduce(s1), c.allreduce(s2)
                outs.append(torch.cat([s1, s2]))
            else:
                buf = a if how == "one" else b
                c.set_tensors(buf, tensors)
                buf.copy_(x)
                c.allreduce(buf)
                outs.append(buf.clone())
        return outs

    def body(c):
        one = run(c, ["one"] * 5)
        return one, c.stats()["compressedCalls"]
    cfg = dict(approx_rank=2, seed=11, start_iter=1)
    ref = on_ranks(2, body, **cfg)
    for plan in (["one"] * 3 + ["moved"] * 2, ["one"] * 3 + ["split"] * 2):
        got = on_ranks(2, lambda c: run(c, plan), **cfg)
        for r in range(2):
            assert all(torch.equal(x, y) for x, y in zip(got[r], ref[r][0])), (plan, r)
    assert ref[0][1] == 4  # the first call of each id is its warm-up (exact)

    def saved(c):
        run(c, ["one"] * 3)
        probe = torch.empty(1)  # never called: declared with the ids, it saves their states
        c.set_tensors(probe, tensors)
        data = c.save_state(probe)  # format 2: each id's state, wherever held
        c.release(probe)
        return data
    data = on_ranks(2, saved, **cfg)

    def restored(c):
        scratch = torch.empty(1)
        c.set_tensors(scratch, tensors)
        c.restore_state(scratch, data[c.rank])
        return run(c, ["split"] * 2)  # the calls 4 and 5 of a run that never stopped
    ins[:] = [x[3:] for x in ins]
    got = on_ranks(2, restored, **cfg)
    for r in range(2):
        assert all(torch.equal(x, y) for x, y in zip(got[r], ref[r][0][3:])), r


def test_save_and_restore_state():
    """save_state -> bytes, restore_state into another buffer (a tensor, or an address as an int):
    the next calls equal those of the buffer that saved, bit for bit on every comm rank. Errors:
    no state to save (code 5), data that is not bytes or is corrupt (InvalidArgumentError, the
    buffer unchanged)."""
    g = torch.Generator().manual_seed(5)
    ins = [[torch.randn(48 * 40 + 8, generator=g) for _ in range(5)] for _ in range(2)]
    shapes = [(48, 40), (8,)]

    def body(c):
        a, b = torch.empty(48 * 40 + 8), torch.empty(48 * 40 + 8)
        c.set_layout(a, shapes)
        seen = {}
        with pytest.raises(lowrank.LowrankError) as e:
            c.save_state(a)  # layout set, no call yet
        seen["nothing"] = (e.value.code, e.value.function)
        outs = []
        for i, x in enumerate(ins[c.rank]):
            a.copy_(x)
            c.allreduce(a)
            if i == 2:
                data = c.save_state(a)
            if i > 2:
                outs.append(a.clone())
        c.set_layout(b, shapes)
        corrupt = data[:-1] + bytes([data[-1] ^ 1])
        for name, bad in {"not_bytes": "text", "empty": b"", "corrupt": corrupt,
                          "truncated": data[:100]}.items():
            with pytest.raises(lowrank.InvalidArgumentError) as e:
                c.restore_state(b, bad)
            seen[name] = str(e.value)
        c.restore_state(b.data_ptr(), bytearray(data))
        again = c.save_state(b)  # restored, not yet called: what was restored
        for x, want in zip(ins[c.rank][3:], outs):
            b.copy_(x)
            c.allreduce(b)
            seen.setdefault("equal", []).append(torch.equal(b, want))
        return seen, again == data, c.view(b)["calls"]
    for seen, same, calls in on_ranks(2, body, approx_rank=2, seed=11):
        assert seen["nothing"] == (5, "lowrankBufferSaveState")
        assert "bytes" in seen["not_bytes"] and "empty" in seen["empty"]
        assert seen["equal"] == [True, True] and same and calls == 5


def test_init_errors_carry_code_and_nothing_leaks():
    """A refused init raises with lowrank's code and message; repeated failures and
    create/destroy cycles leave no descriptor and no thread behind."""
    uid = lowrank.get_unique_id()
    with pytest.raises(lowrank.InvalidArgumentError) as e:
        lowrank.Communicator.init_rank(2, uid, 5)
    assert e.value.code == 4 and "rank" in e.value.message
    with pytest.raises(lowrank.LowrankError) as e:
        lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, approx_rank=-3)
    assert e.value.code == 4
    with pytest.raises(TypeError):
        lowrank.make_config(rank=4)
    # values ctypes would wrap, or that equal C's "unset" sentinels, are refused
    for bad in ({"approx_rank": 2**33}, {"seed": -1}, {"seed": 2**64}, {"timeout": -1},
                {"ortho_epsilon": -1}, {"min_compression_rate": -1.0}):
        with pytest.raises(lowrank.InvalidArgumentError):
            lowrank.make_config(**bad)

    def cycle():  # (an id never used keeps its listening socket until LOWRANK_TIMEOUT: not made)
        uid = lowrank.get_unique_id()
        with lowrank.Communicator.init_rank(1, uid, 0) as c:
            buf = np.ones(4096, dtype=np.float32)
            c.allreduce(buf)
            for bad in (lambda: c.allreduce(buf, op="x"), lambda: c.set_layout(buf, [(3, 3)]),
                        lambda: c.allreduce(buf)):
                try:
                    bad()
                except lowrank.LowrankError:
                    pass
        try:
            lowrank.Communicator.init_rank(2, uid, 7)
        except lowrank.LowrankError:
            pass
    cycle()  # the first one loads UCX's context
    time.sleep(0.5)
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for _ in range(10):
        cycle()
    time.sleep(1.0)
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert threading.active_count() <= threads


def test_closed_communicator_raises():
    c = lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0)
    c.destroy()
    c.destroy()  # a second destroy does nothing
    with pytest.raises(lowrank.LowrankError) as e:
        c.stats()
    assert e.value.code == 5 and "destroyed" in str(e.value)


def test_gil_released_during_a_blocking_call():
    """Comm rank 0 blocks in an allreduce until rank 1 joins 0.5 s later; meanwhile this
    thread keeps running Python (it could not if the call held the GIL)."""
    uid = lowrank.get_unique_id()
    comms = [None, None]
    ready = threading.Barrier(3)

    def make(r):
        comms[r] = lowrank.Communicator.init_rank(2, uid, r)
        ready.wait()
    ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    ready.wait()
    [t.join() for t in ts]
    a, b = np.ones(1 << 16), np.ones(1 << 16)  # float64: exact
    done = threading.Event()
    t0 = threading.Thread(target=lambda: (comms[0].allreduce(a, op="sum"), done.set()))
    t0.start()
    time.sleep(0.05)
    spins, end = 0, time.monotonic() + 0.5
    while time.monotonic() < end:
        spins += 1
    assert not done.is_set(), "rank 0's allreduce returned before rank 1 joined"
    comms[1].allreduce(b, op="sum")
    t0.join(30)
    assert done.is_set() and spins > 10000
    assert np.array_equal(a, np.full(1 << 16, 2.0))
    [c.destroy() for c in comms]


def test_abort_from_another_thread_ends_a_blocked_call():
    """abort() while a call waits for a peer that never comes: the call raises promptly."""
    uid = lowrank.get_unique_id()
    comms = [None, None]
    ts = [threading.Thread(target=lambda r=r: comms.__setitem__(r, lowrank.Communicator.init_rank(2, uid, r)))
          for r in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    errs = []

    def blocked():
        try:
            comms[0].allreduce(np.ones(1000, dtype=np.float32), op="sum")
        except lowrank.LowrankError as e:
            errs.append(e)
    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.3)
    t_abort = time.monotonic()
    comms[0].abort()
    t.join(20)
    assert not t.is_alive() and errs and time.monotonic() - t_abort < 10
    comms[1].destroy()


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60)


def test_library_not_found_names_the_paths_tried():
    """LOWRANK_LIBRARY pointing nowhere: LibraryNotFoundError naming the path; the process goes on.
    A copy of the package away from any build, with no LOWRANK_LIBRARY: the error lists the
    places tried (or the library is found in the system's paths, if installed there)."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import lowrank\n"
            "try:\n    lowrank.library_path()\n"
            "except lowrank.LibraryNotFoundError as e:\n    print('ERR', e.code, e)\n"
            "print('went on')\n")
    r = _run(code % os.path.join(ROOT, "python"), LOWRANK_LIBRARY="/nonexistent/liblowrank.so")
    assert "ERR 2" in r.stdout and "/nonexistent/liblowrank.so" in r.stdout, r.stdout + r.stderr
    assert "LOWRANK_LIBRARY" in r.stdout and "went on" in r.stdout
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(ROOT, "python", "lowrank"), os.path.join(tmp, "lowrank"),
                        ignore=shutil.ignore_patterns("__pycache__", "_install.py"))
        env = {k: v for k, v in os.environ.items() if k not in ("LOWRANK_LIBRARY", "LD_LIBRARY_PATH")}
        r = subprocess.run([sys.executable, "-c", code % tmp], env=env, capture_output=True,
                           text=True, timeout=60)
        if "ERR" in r.stdout:
            assert "liblowrank.so.0" in r.stdout and os.path.join(tmp, "lowrank") not in r.stdout \
                or "tried" in r.stdout
            assert "went on" in r.stdout
        else:
            assert "went on" in r.stdout  # installed in the system's paths


def test_stats_and_config_shapes():
    def body(c):
        cfg, st = c.config(), c.stats()
        return cfg, st, c.size, c.rank
    cfg, st, size, rank = on_ranks(1, body, approx_rank=3, start_iter=2, pipeline=False)[0]
    assert cfg["approx_rank"] == 3 and cfg["start_iter"] == 2 and cfg["pipeline"] == 0
    assert cfg["timeout"] > 0 and size == 1 and rank == 0
    assert st["calls"] == 0 and st["ratio"] == 0.0
