"""Checkpoint and restore of lowrank.torch's PowerSGDState (state_dict / load_state_dict, and
pickling), under DDP over gloo, ranks as processes (tests/python/ckpt_worker.py).

Run A trains 10 steps uninterrupted; run B trains 5, saves model, optimizer and hook state per
rank, and exits; new processes load them and train 5 more on the same data. B's parameters must
equal A's bit for bit on every rank. The model (ckpt_worker.Net) has three buckets after DDP's
rebuild, and one bucket of every parameter at DDP's first step of each process (where B resumes):
each parameter's state (its id's) goes from the saved buckets into that one, and on at the
rebuild. At world 2 a tensor's compressed allreduce does not depend on the bucket around it
(a sum of two is the same in either order), so any bucketing gives the same bits.
"""
import os
import shutil

import pytest
import numpy as np
import torch

from conftest import results, run_ranks

WORLD, STEPS, CUT = 2, 10, 5


def ckpt(*args, timeout=180, env=None):
    return run_ranks(WORLD, *args, timeout=timeout, env=env, worker="ckpt_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A, then run B's first part (the checkpoint files), once for the module."""
    d = str(tmp_path_factory.mktemp("ckpt"))
    full = results(ckpt("full", d, STEPS))
    first = results(ckpt("first", d, CUT))
    return d, full, first


def _params(d, name, rank):
    return torch.load(f"{d}/{name}_rank{rank}.pt")


def _same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)


def _canon(d, name, rank):
    with open(f"{d}/canon_{name}_rank{rank}.bin", "rb") as f:
        return f.read()


def test_checkpoint_holds_every_bucket(runs):
    d, full, first = runs
    for r, res in enumerate(first):
        # step 0 (DDP's exact warm-up): one bucket of all 10 parameters; then DDP's rebuild: three
        assert res["buckets"]["0"] == [10], res["buckets"]
        assert all(res["buckets"][str(s)] == [2, 6, 2] for s in range(1, CUT)), res["buckets"]
        assert res["iter"] == CUT and res["rank"] == r
        # the ids: the parameters' numbers in the model's order (DDP's first bucket)
        assert res["saved"] == [[9, 8], [6, 7, 5, 4, 3, 2], [1, 0]], res["saved"]
        assert res["version"] == 2 and res["devices"] == ["cpu"] * 3
        assert all(n > 0 for n in res["bytes"])
    assert full[0]["compressed"] == (STEPS - 1) * 3


@pytest.mark.parametrize("how", ["state_dict", "pickle"])
def test_resume_equals_uninterrupted(runs, how):
    """Parameters after 5 + 5 steps with a restart equal those of 10 steps, every rank."""
    d, _, _ = runs
    res = results(ckpt("resume", d, CUT, STEPS, how))
    for r in range(WORLD):
        assert _same(_params(d, f"resume_{how}", r), _params(d, "full", r)), f"rank {r} differs"
        log = res[r]["log"]
        assert not [m for m in log if "not used" in m], log
        # DDP's first step after the restart: one bucket, which takes the three saved buckets'
        # states (by id); every parameter's state at the end is the uninterrupted run's
        assert res[r]["buckets"][str(CUT)] == [10]
        assert any("loaded the state of 10 tensors (3 saved buckets, version 2)" in m
                   for m in log), log
        assert _canon(d, f"resume_{how}", r) == _canon(d, "full", r), f"rank {r}: states differ"
        assert res[r]["iter"] == STEPS
    if how == "state_dict":
        for r in res:
            assert "matrix_approximation_rank: saved 2, this state 3" in r["other_k"], r
            assert "every rank loads the state it saved" in r["other_rank"], r
            assert r["roundtrip"] is True
    else:
        assert all(r["process_group"] == "None" for r in res)
        assert all(any("Process group will be set to a default group" in m for m in r["log"])
                   for r in res)


@pytest.mark.parametrize("cap", ["25", "0.005"])
def test_restart_into_another_bucket_cap(runs, cap):
    """B's checkpoint (bucket_cap_mb 0.02: buckets of 2, 6, 2 parameters) resumed with another
    bucket_cap_mb (DDP's first step still one bucket of all 10, then rebuilt otherwise: torch
    1.13 makes [2, 8] and [2, 4, 2, 2] of these caps, torch 2.15 [10] and [1, 1, 4, 2, 2]):
    every parameter's state, per id, finds it. Parameters after 5 + 5 steps equal A's bit
    for bit, and every tensor's residual, warm-start Q and call count at the end equal A's (the
    saved format-2 bytes in id order)."""
    d, _, first = runs
    tag = f"_cap{cap}"
    res = results(ckpt("resume", d, CUT, STEPS, "state_dict",
                       env={"CKPT_CAP": cap, "CKPT_TAG": tag}))
    saved = first[0]["buckets"][str(CUT - 1)]
    for r in range(WORLD):
        assert res[r]["buckets"][str(CUT)] == [10], res[r]["buckets"]
        assert res[r]["buckets"][str(STEPS - 1)] != saved, (res[r]["buckets"], saved)
        assert not [m for m in res[r]["log"] if "not used" in m], res[r]["log"]
        assert _same(_params(d, f"resume_state_dict{tag}", r), _params(d, "full", r)), \
            f"rank {r}: parameters differ"
        assert _canon(d, f"resume_state_dict{tag}", r) == _canon(d, "full", r), \
            f"rank {r}: tensor states differ"


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def test_version_1_checkpoint_loads(tmp_path):
    """A checkpoint of lowrank's hook before tensor ids (state_dict version 1: per-bucket
    format-1 bytes; tests/python/fixtures, saved by that hook under torch 1.13) loads into today's
    hook, each bucket's bytes turned into its parameters' states: 5 steps of the old hook + 5 of
    today's equal the old hook's 10 steps (torch 1.13; under 2.15, its own restore and 5 steps)
    bit for bit. start_powerSGD_iter 3: the old buffers count 2 compressed calls at step 5,
    which today's hook reads as 5 calls (lowrankStateAddCalls adds the warm-up), past the
    warm-up: else 1 more exact step would make the runs differ."""
    version = ".".join(torch.__version__.split(".")[:2])
    for r in range(WORLD):
        shutil.copy(f"{FIXTURES}/v1_ckpt_rank{r}.pt", f"{tmp_path}/ckpt_rank{r}.pt")
    env = {"CKPT_MODEL": "small", "CKPT_START": "3", "CKPT_CAP": "0.001"}
    res = results(ckpt("resume", str(tmp_path), CUT, STEPS, "state_dict", env=env))
    for r in range(WORLD):
        assert any("(4 saved buckets, version 1)" in m for m in res[r]["log"]), res[r]["log"]
        assert not [m for m in res[r]["log"] if "not used" in m], res[r]["log"]
        assert res[r]["roundtrip"] is True  # state_dict() gives the loaded version 1 back
        got = _params(str(tmp_path), "resume_state_dict", r)
        got = torch.cat([p.flatten() for p in got.values()]).numpy().tobytes()
        expected = f"{FIXTURES}/v1_expected_torch{version}_rank{r}.bin"
        if not os.path.exists(expected):
            pytest.skip(f"the old hook's parameters are recorded for torch 1.13 and 2.15, whose "
                        f"arithmetic differs in the last bit; this is torch {torch.__version__}")
        with open(expected, "rb") as f:
            want = f.read()
        if version == "1.13":
            assert got == want, f"rank {r} differs"
            continue
        # torch 2.x picks its CPU kernels by the machine's instruction set, so the recording's
        # last bits are its machine's (a 2-core Xeon with AVX-512 FP16 differs by 3e-8, one
        # rounding, from it): equal within 1e-6 of the largest parameter, about 8 roundings.
        g, w = np.frombuffer(got, np.float32), np.frombuffer(want, np.float32)
        assert g.shape == w.shape
        assert np.max(np.abs(g - w)) <= 1e-6 * np.max(np.abs(w)), \
            f"rank {r} differs by {np.max(np.abs(g - w))} (largest parameter {np.max(np.abs(w))})"


def test_version_1_fixtures_load_with_weights_only():
    """The fixtures, saved by torch 1.13, load with torch.load(weights_only=True) on torch 2.x
    (1.13's weights_only refuses bytes: its default there); their format-1 bytes take
    lowrankStateAddCalls: the call count (the u64 at byte 48) and the CRC change, nothing else."""
    from lowrank.comm import state_add_calls
    safe = {} if torch.__version__.startswith("1.") else {"weights_only": True}
    for r in range(WORLD):
        sd = torch.load(f"{FIXTURES}/v1_ckpt_rank{r}.pt", **safe)["powersgd"]
        assert sd["version"] == 1 and sd["rank"] == r and len(sd["buckets"]) == 4
        for b in sd["buckets"]:
            data = b["state"]
            assert data[:12] == b"LRSTATE\0" + (1).to_bytes(4, "little")
            more = state_add_calls(data, 3)
            calls = int.from_bytes(data[48:56], "little")
            assert calls == 2 and int.from_bytes(more[48:56], "little") == calls + 3
            assert more[:48] == data[:48] and more[56:-4] == data[56:-4] and more[-4:] != data[-4:]


def test_resume_without_hook_state_differs(runs):
    """The control: model and optimizer restored, the hook's buckets not: other parameters
    (the test above would see a lost residual or warm start)."""
    d, _, _ = runs
    results(ckpt("resume", d, CUT, STEPS, "none"))
    for r in range(WORLD):
        assert not _same(_params(d, "resume_none", r), _params(d, "full", r))


@pytest.mark.parametrize("when", ["restart", "live"])
def test_restore_on_one_rank_fails_on_every_rank(runs, when):
    """Rank 0 restores the tensors' states, rank 1 only the counters: every rank's backward
    raises lowrankInvalidUsage within seconds (no hang, no silent divergence). restart: at the
    first step after loading (DDP's one bucket on both ranks); live: two steps later, after DDP's
    rebuild, each rank reloading its own state. Rank 1's tensors are fresh, in their warm-up
    (exact), rank 0's restored past it (compressed): lowrank's plan check across ranks fails
    ("disagree on (count, dtype, op, layout, k)"; with both past the warm-up, its check of the
    restored states: "disagree on its restored state")."""
    d, _, _ = runs
    for r in results(ckpt("one_rank", d, CUT, when)):
        assert r["raised"], r
        assert "lowrankInvalidUsage" in r["message"], r
        assert "disagree on (count" in r["message"] or \
            "disagree on its restored state" in r["message"], r
        assert r["after"] < 20, r


def test_resume_saved_when_compression_starts(tmp_path):
    """A checkpoint at step == start_powerSGD_iter (3) holds each tensor's warm-up count (3
    exact calls) and no residual or Q yet: the restarted run compresses from its first step, as
    the run without a restart did, and the parameters after 3 + 3 steps equal those of 6 steps
    bit for bit."""
    d, env = str(tmp_path), {"CKPT_START": "3"}
    results(ckpt("full", d, 6, env=env))
    for r in results(ckpt("first", d, 3, env=env)):
        assert r["iter"] == 3 and len(r["saved"]) == 3 and all(n > 0 for n in r["bytes"]), r
    res = results(ckpt("resume", d, 3, 6, "state_dict", env=env))
    for r in range(WORLD):
        assert _same(_params(d, "resume_state_dict", r), _params(d, "full", r)), f"rank {r} differs"
        assert res[r]["buckets"]["3"] == [10]  # DDP's first step in the new processes
        assert not [m for m in res[r]["log"] if "not used" in m], res[r]["log"]


def test_malformed_state_dict_raises_value_error_and_changes_nothing(world_of_one):
    """In one process: a state_dict whose counters or bucket list are malformed is a ValueError
    naming the field, and the state keeps what an earlier load_state_dict gave it."""
    from lowrank.torch import PowerSGDState
    _malformed_loads(PowerSGDState)


def test_load_into_other_parameters(world_of_one, caplog):
    """In one process: a saved id that no bucket takes in the first step is named in a WARNING
    and dropped (lowrank then holds the live bucket only); a saved id whose shape is not that of
    the parameter numbered so is refused: ValueError from load_state_dict where the state
    already numbered it, LowrankError at the hook's call where it numbers it after the load."""
    import logging
    import lowrank
    from buckets import SyntheticBucket
    from lowrank.torch import PowerSGDState, powerSGD_hook
    kw = dict(matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=3)
    a = PowerSGDState(None, **kw)
    powerSGD_hook(a, SyntheticBucket(0, torch.randn(64 * 32 + 32), [(64, 32), (32,)])).wait()
    sd = a.state_dict()
    a.close()
    assert [b["params"] for b in sd["buckets"]] == [(0, 1)]

    fewer = PowerSGDState(None, **kw)  # a model of the first parameter only
    fewer.load_state_dict(sd)
    with caplog.at_level(logging.WARNING, logger="lowrank.torch"):
        powerSGD_hook(fewer, SyntheticBucket(0, torch.randn(64 * 32), [(64, 32)])).wait()
    assert any("saved states of 1 tensors were not used" in m and "Unused ids: 1" in m
               for m in caplog.messages), caplog.messages
    assert fewer.stats()["buffers"] == 1  # the load's scratch buffer went after the step
    assert [b["params"] for b in fewer.state_dict()["buckets"]] == [(0,)]
    fewer.close()

    other = PowerSGDState(None, **kw)  # id 0 is a (32, 64) parameter here
    other.load_state_dict(sd)
    with pytest.raises(lowrank.LowrankError, match=r"numbered otherwise .*id 0: this model's "
                                                   r"parameter \(32, 64\), saved \(64, 32\)"):
        powerSGD_hook(other, SyntheticBucket(0, torch.randn(64 * 32), [(32, 64)]))
    other.close()
    seen = PowerSGDState(None, **kw)
    powerSGD_hook(seen, SyntheticBucket(0, torch.randn(64 * 32), [(32, 64)])).wait()
    with pytest.raises(ValueError, match="numbered otherwise"):
        seen.load_state_dict(sd)
    assert seen.state_dict()["buckets"][0]["shapes"] == ((32, 64),)  # unchanged
    seen.close()


def _malformed_loads(PowerSGDState):
    state = PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    good = state.state_dict()
    good.update(iter=7, buckets=[{"params": [0, 1], "shapes": [[4, 3], [3]], "device": "cpu",
                                  "bucket": 0, "state": None}])
    state.load_state_dict(good)
    for field, value in (("iter", None), ("iter", "x"), ("next_stats_report", -1),
                         ("buckets", None)):
        with pytest.raises(ValueError, match=f"malformed {field}"):
            state.load_state_dict(dict(good, **{field: value}))
        assert state.iter == 7 and state.state_dict()["buckets"] == good["buckets"], (field, value)
    for bad in ({"params": [0, 1], "shapes": [[4, 3], [3]], "state": None},  # no device
                {"params": [0, 0], "shapes": [[4, 3], [3]], "device": "cpu", "state": None},
                {"params": [0], "shapes": [[4, 0]], "device": "cpu", "state": None}):
        with pytest.raises(ValueError, match="is not a saved bucket"):
            state.load_state_dict(dict(good, buckets=[bad]))
    with pytest.raises(ValueError, match="versions 1 and 2"):
        state.load_state_dict(dict(good, version=3))
    state.close()
