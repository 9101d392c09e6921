"""lowrank.torch's hook with factor_dtype (issue 45, lowrankConfig_t.factorDtype): PowerSGD's
factors on the wire as bf16 or fp16, the exact part and the state float32. DDP over gloo, 2 ranks as
processes (tests/python/factor_dtype_worker.py), and one process. The FSDP2 hook's factor_dtype:
tests/python/test_fsdp.py; the refused values of both hooks: conftest.BAD_SETTINGS."""
import ctypes

import pytest
import torch

from conftest import results, run_ranks

WORLD, STEPS, START = 2, 4, 2


def test_bf16_factors_train_with_half_the_bytes():
    """2 ranks, two (96, 96) weights, k = 2, compression from step 2, the same data and initial
    model trained with factor_dtype "fp32" and torch.bfloat16 (the torch dtype taken as "bf16"):
    - each reduced buffer is the same on both ranks at every step; the warm-up steps (exact)
      are the same in both runs, the compressed ones differ (the wire's rounding);
    - lowrank's bytesSent per compressed step with bf16 is under 0.75 of fp32's (the factors
      are nearly all of it: about half), per warm-up step the same;
    - both runs train (the loss goes down, the parameters stay finite), and the communicator
      and the state_dict report the factor dtype;
    - the bf16 run's state_dict (through torch.save) loads into a state with factor_dtype
      "fp32": its first step is compressed (the per-parameter calls and warm-up were restored,
      else 2 more exact steps would come) and sends what the fp32 run sends per compressed
      step."""
    res = results(run_ranks(WORLD, "train", STEPS, START, worker="factor_dtype_worker.py",
                            timeout=120))
    for run in ("fp32", "bf16", "resumed"):
        assert res[0][run]["outs"] == res[1][run]["outs"], run  # identical on every rank
    for r in res:
        fp32, bf16, resumed = r["fp32"], r["bf16"], r["resumed"]
        assert (fp32["config"], bf16["config"], resumed["config"]) == ("fp32", "bf16", "fp32")
        assert (fp32["option"], bf16["option"], resumed["option"]) == ("fp32", "bf16", "fp32")
        for run in (fp32, bf16):
            assert run["finite"] and run["losses"][-1] < run["losses"][0], run
            assert run["compressed"] == [0] * START + [1] * (STEPS - START), run
        assert fp32["outs"][:START] == bf16["outs"][:START]
        assert all(a != b for a, b in zip(fp32["outs"][START:], bf16["outs"][START:]))
        assert fp32["sent"][:START] == bf16["sent"][:START]
        for s in range(START, STEPS):
            assert 0 < bf16["sent"][s] < 0.75 * fp32["sent"][s], (s, fp32["sent"], bf16["sent"])
        assert resumed["compressed"] == [1, 1] and resumed["finite"], resumed
        # fp32's bytes: its factors, and a first call's plan check (a new plan: DDP's rebuild)
        lo, hi = min(fp32["sent"][START:]), max(fp32["sent"][START:])
        assert all(lo <= n <= hi for n in resumed["sent"]), (resumed["sent"], fp32["sent"])


def test_ranks_with_different_factor_dtypes_all_raise():
    """Rank 0 with "bf16", rank 1 with "fp32": both raise at the first compressed call (lowrank's
    plan check, naming the factor dtype), within the test's deadline: none hangs."""
    runs = run_ranks(WORLD, "mismatch", worker="factor_dtype_worker.py", timeout=90)
    for r in results(runs):
        assert r["raised"] is not None, r
        assert "factor dtype" in r["message"], r["message"]
        assert "lowrankInvalidUsage" in r["message"], r["message"]


# ---- in one process ------------------------------------------------------------------------------

def test_state_dict_option_and_old_state_dicts(world_of_one):
    """state_dict()["options"]["factor_dtype"] is the state's name for it, not a checked
    setting; a state_dict without it (saved before the option existed) loads into a state of
    either factor dtype, which keeps its own; an old pickle takes "fp32". None: the state keeps
    None and the communicator LOWRANK_FACTOR_DTYPE's (fp32 unset)."""
    from lowrank.torch import PowerSGDState
    from buckets import SyntheticBucket
    kw = dict(matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=3)
    a = PowerSGDState(None, factor_dtype="float16", **kw)
    buf = torch.randn(64 * 32 + 32, generator=torch.Generator().manual_seed(1))
    bucket = SyntheticBucket(0, buf, [(64, 32), (32,)])
    out = a.communicator().config()["factor_dtype"]
    assert out == "fp16"
    from lowrank.torch import powerSGD_hook
    powerSGD_hook(a, bucket).wait()
    sd = a.state_dict()
    assert sd["options"]["factor_dtype"] == "fp16" and "factor_dtype" not in sd["config"]
    a.close()
    old = dict(sd, options={k: v for k, v in sd["options"].items() if k != "factor_dtype"})
    for dtype, want in (("bf16", "bf16"), ("fp32", "fp32"), (None, None)):
        b = PowerSGDState(None, factor_dtype=dtype, **kw)
        b.load_state_dict(old)
        buf.normal_()
        assert torch.isfinite(powerSGD_hook(b, bucket).wait()).all()
        assert b.stats()["compressedCalls"] == 1
        assert b.state_dict()["options"]["factor_dtype"] == want
        assert b.communicator().config()["factor_dtype"] == (want or "fp32")
        b.close()
    for options, want in ((old["options"], "fp32"), (sd["options"], "fp16")):
        s = PowerSGDState.__new__(PowerSGDState)  # as pickle.load does
        s.__setstate__(dict(sd, options=options))
        assert s.state_dict()["options"]["factor_dtype"] == want
        assert s._config["factor_dtype"] == want
        s.close()


def test_communicator_factor_dtype_and_bad_values():
    """Communicator's config key factor_dtype: each spelling is given back as its name; a bad
    value raises InvalidArgumentError (a ValueError) naming the key and the values taken."""
    import lowrank
    for given, name in (("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"),
                        ("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"),
                        ("BF16", "bf16"), ("Float16", "fp16"),
                        (torch.float32, "fp32"), (torch.bfloat16, "bf16"),
                        (torch.float16, "fp16"), (torch.half, "fp16"), (None, "fp32")):
        with lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0,
                                            factor_dtype=given) as c:
            assert c.config()["factor_dtype"] == name, given
    for bad in ("int8", "bf 16", "bf16 ", 16, 9, True, torch.float64, 2.0):
        with pytest.raises(lowrank.InvalidArgumentError) as e:
            lowrank.make_config(factor_dtype=bad)
        assert isinstance(e.value, ValueError)
        assert "factor_dtype must be one of 'fp32', 'bf16', 'fp16'" in str(e.value), bad


class _OlderLibrary:
    """liblowrank as a library older than lowrankConfig_t.factorDtype answers: the calls that
    take a config refuse any size but the older one (as its resolveConfig and
    lowrankCommGetConfig do), and read only the fields before factorDtype. The rest passes
    through to the real library."""

    def __init__(self, lib):
        from lowrank import _capi
        self._lib, self._capi, self._error = lib, _capi, None
        self.refused = 0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def _older(self, fn, cfg_ref, *args, getter=False):
        cfg = cfg_ref._obj
        if cfg.size != self._capi.CONFIG_SIZE_NO_FACTOR_DTYPE:
            self.refused += 1
            self._error = (b"lowrankConfig_t not initialized with LOWRANK_CONFIG_INITIALIZER "
                           b"(size %d, magic 0x%x)" % (cfg.size, cfg.magic))
            return 4
        self._error = None
        mine = self._capi.Config.from_buffer_copy(bytes(cfg) + b"\0" * 8)
        mine.size, mine.factorDtype = ctypes.sizeof(mine), self._capi.UNDEF_INT
        rc = getattr(self._lib, fn)(*args, ctypes.byref(mine))
        n = self._capi.CONFIG_SIZE_NO_FACTOR_DTYPE
        if getter:  # the older library writes only its own fields
            ctypes.memmove(ctypes.addressof(cfg) + 8, ctypes.addressof(mine) + 8, n - 8)
        return rc

    def lowrankCommInitRankConfig(self, comm, nranks, uid, rank, cfg):
        return self._older("lowrankCommInitRankConfig", cfg, comm, nranks, uid, rank)

    def lowrankCommGetConfig(self, comm, cfg):
        return self._older("lowrankCommGetConfig", cfg, comm, getter=True)

    def lowrankGetLastError(self, handle):
        if handle is None and self._error is not None:
            return self._error
        return self._lib.lowrankGetLastError(handle)


def test_an_older_library_without_factor_dtype(monkeypatch):
    """A library older than factorDtype (emulated: _OlderLibrary) refuses this package's larger
    lowrankConfig_t: the communicator is made with the older size when factor_dtype is unset or
    "fp32" (what such a library sends) and config() reports "fp32"; "bf16" and "fp16" raise
    LowrankError naming 16-bit factors and the library."""
    import lowrank
    from lowrank import _capi, comm
    older = _OlderLibrary(_capi.load())
    monkeypatch.setattr(comm._capi, "load", lambda: older)
    for given in (None, "fp32"):
        with lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, approx_rank=3,
                                            factor_dtype=given) as c:
            cfg = c.config()
            assert (cfg["factor_dtype"], cfg["approx_rank"]) == ("fp32", 3)
            buf = torch.randn(64 * 32)
            c.set_layout(buf, [(64, 32)])
            c.allreduce(buf)
            assert c.stats()["compressedCalls"] == 1
    assert older.refused == 4  # each init and each config() tried the newer size first
    for given in ("bf16", torch.float16):
        with pytest.raises(lowrank.LowrankError) as e:
            lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, factor_dtype=given)
        assert "older than this package: no 16-bit factors" in str(e.value), e.value
        assert not isinstance(e.value, lowrank.InvalidArgumentError)
