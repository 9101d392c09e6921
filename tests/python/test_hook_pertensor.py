"""Per-tensor control in lowrank.torch's hook: exclude / rank_of reach lowrank's declaration
(tensor_ranks, from lowrankBufferGetTensorRanks), excluded gradients are the exact mean, a change
of ranks between steps keeps training (counted in rankChanges), a state_dict loads under other
ranks; bad settings are clear errors before anything starts."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import BAD_SETTINGS, results, run_ranks
from lowrank.torch import PowerSGDState
from lowrank.torch.adaptive import AdaptiveRank
from lowrank.torch.tensor_ranks import TensorRanks

BIASES = {"fc1.bias": 0, "fc2.bias": 0, "head.bias": 0}


def test_exclude_and_rank_of_under_ddp():
    res = results(run_ranks(2, "run", worker="pertensor_worker.py", timeout=180))
    for r in res:
        assert r["finite"] == [True, True, True]
        # Phase 1: embedding and head exact, fc1 its own 4, fc2 the default 2.
        assert r["ranks"][0] == {"embed.weight": 0, "head.weight": 0, "fc1.weight": 4,
                                 "fc2.weight": 2, **BIASES}
        assert r["diffs1"]["embed.weight"] < 1e-6 and r["diffs1"]["head.weight"] < 1e-6
        assert r["diffs1"]["fc1.weight"] > 1e-4  # compressed: the check tells them apart
        assert r["changes"][0] == 0 and r["compressed"][0] > 0
        # Phase 2 (set_tensor_ranks): fc1 back to the default, fc2 3, head 1; three changes.
        assert r["ranks"][1] == {"embed.weight": 0, "head.weight": 1, "fc1.weight": 2,
                                 "fc2.weight": 3, **BIASES}
        assert r["diffs2"]["embed.weight"] < 1e-6 and r["diffs2"]["head.weight"] > 1e-4
        assert r["changes"][1] == 3
        # Phase 3: loaded under other ranks; a restore is no declared change.
        assert r["ranks"][2] == {"embed.weight": 2, "head.weight": 2, "fc1.weight": 5,
                                 "fc2.weight": 2, **BIASES}
        assert r["changes"][2] == 0 and r["compressed"][1] > 0
        # The frozen layer named in exclude is in no bucket: said once.
        assert sum("no bucket holds" in w and "frozen.weight" in w for w in r["warnings"]) == 1
    assert res[0]["checksum"] == res[1]["checksum"]  # the ranks' models stayed identical


def _switch_steps(history, name):
    """(step, k) at each step where the parameter's k differs from the step before."""
    ks = [h[name] for h in history]
    return [(t, k) for t, k in enumerate(ks) if t and k != ks[t - 1]]


def test_adaptive_rank_under_ddp():
    """AdaptiveRank(low 1, high 4) with a detector that never fires (eta huge): each matrix starts
    at high, its first decision is critical (no earlier norm), the next one quiet: low from the
    step measured step + lag decides on, on every rank alike; an error_max below any error keeps
    high throughout; ranks whose own signals disagree across error_max switch alike; the
    excluded embedding stays exact."""
    res = results(run_ranks(2, "adaptive", worker="pertensor_worker.py", timeout=180))
    local = [r.pop("local_errors") for r in res]
    sums = [r.pop("window_sums") for r in res]
    for r in res:  # restarts go on as the run that did not stop: ks and the rule's numbers
        rs = r.pop("restarts")
        whole = rs["whole"]
        assert {1, 4} <= {h["fc1.weight"] for h in whole.values()}, whole  # it does switch
        for name, ks in rs["ks"].items():
            assert ks and all(ks[s] == whole[s] for s in ks), (name, ks, whole)
            sig = rs["signals"][name]
            decided = [s for s in sorted(sig, key=int) if sig[s][0] is not None]
            assert decided, (name, sig)
            for s in decided:  # from its first decision on, the same numbers to the last bit
                assert sig[s] == rs["signals"]["whole"][s], (name, s, sig[s])
    # The rule's gradient norm is the window's: |sum of the 3 steps' averaged gradients| (each
    # step's as lowrank returned it to DDP), not the last step's alone; alike on every rank.
    for w in sums:
        assert w["measured"] == 2
        for name in ("fc1.weight", "fc2.weight", "head.weight"):
            assert w["rule"][name] == pytest.approx(w["sum"][name], rel=1e-5), (name, w)
            assert abs(w["rule"][name] - w["last"][name]) > 1e-3 * w["last"][name], (name, w)
    assert sums[0]["rule"] == sums[1]["rule"]
    for r in res:  # a restart from state_dict() goes on with the rule's last ks, no change
        back = r.pop("resumed")
        assert back["ranks"] == r["window2_lag1"]["history"][-1] and back["changes"] == 0
        assert back["ranks"]["fc1.weight"] == 1  # not the rule's initial 4
    for r in res:
        for run in r.values():
            assert run["finite"]
            assert all(h["embed.weight"] == 0 for h in run["history"])
        # window 2, lag 1: measured at steps 1, 3, 5; decided at 2 (critical), 4 (quiet).
        w = r["window2_lag1"]
        for name in ("fc1.weight", "fc2.weight", "head.weight"):
            assert w["history"][0][name] == 4
            assert _switch_steps(w["history"], name) == [(4, 1)], (name, w["history"])
        assert w["changes"] == 3
        # window 1, lag 2: measured every step; decided at 2 (critical), 3 (quiet) on.
        w = r["window1_lag2"]
        assert _switch_steps(w["history"], "fc1.weight") == [(3, 1)], w["history"]
        # error_max below any compression error: high throughout, no change.
        w = r["error_keeps_high"]
        assert all(h["fc1.weight"] == 4 for h in w["history"]) and w["changes"] == 0
        # Each rank's own errors disagree across error_max (rank 0 far above, rank 1 at 0):
        # the decision, from the numbers summed over the ranks, is the same on both.
        assert all(h["fc1.weight"] in (1, 4) for h in r["local_signals_differ"]["history"])
    assert local[0] and min(local[0]) >= 0.9 and max(local[1]) == 0
    assert res[0] == res[1]  # every rank the same k at every step


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(exclude=["embed.weight"]), "give model="),
    (dict(exclude=lambda name, p: True), "give model="),
    (dict(exclude=["embed.wieght"], model="m"), "which the model has not"),
    (dict(rank_of={"head.weight": -1}, model="m"), "rank -1"),
    (dict(rank_of={"head.weight": True}, model="m"), "rank True"),
    (dict(rank_of=["head.weight"], model="m"), "must be a dict"),
    (dict(exclude=[3], model="m"), "parameters (tensors) or"),
    (dict(matrix_approximation_rank=0, rank_of={"head.weight": 4}, model="m"),
     "turns compression off for every parameter"),
    (dict(matrix_approximation_rank=0, adaptive="rule"), "an adaptive rank needs a k > 0"),
    (dict(matrix_approximation_rank=20000, adaptive="rule"), "above 65536"),
])
def test_bad_settings_are_clear_errors(kwargs, message):
    """Checked before torch.distributed is needed: each raises ValueError naming the problem."""
    if kwargs.get("model") == "m":
        kwargs["model"] = _Tiny()
    if kwargs.get("adaptive") == "rule":
        kwargs["adaptive"] = AdaptiveRank()
    with pytest.raises(ValueError, match=None) as e:
        PowerSGDState(None, **kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize("kwargs,error,message", BAD_SETTINGS + [
    (dict(matrix_approximation_rank=np.bool_(True)), TypeError, "must be an int"),
    (dict(matrix_approximation_rank=torch.tensor(4)), TypeError, "must be an int"),
    (dict(compression_stats_logging_frequency=None), TypeError, "compression_stats_logging_frequency"),
])
def test_arguments_out_of_lowranks_range_are_named(kwargs, error, message):
    """Checked before torch.distributed is needed, under PyTorch's argument names (not the C
    API's field names, and never truncated: 2.7 is not taken as 2)."""
    with pytest.raises(error) as e:
        PowerSGDState(None, **kwargs)
    assert message in str(e.value)


def test_settings_are_kept_as_plain_python_types():
    """NumPy scalars and a timedelta are taken, and kept as int, float and bool: the state_dict
    of a state made from them loads with torch.load(weights_only=True)."""
    import datetime
    from lowrank.torch.settings import check_settings
    kw = dict(matrix_approximation_rank=np.int64(4), start_powerSGD_iter=np.int32(10),
              min_compression_rate=np.float32(1.5), use_error_feedback=np.bool_(True),
              warm_start=1, orthogonalization_epsilon=np.float64(1e-8), random_seed=np.uint8(3),
              compression_stats_logging_frequency=np.int64(100),
              batch_tensors_with_same_shape=False, timeout=datetime.timedelta(seconds=30),
              pipeline=None)
    check_settings(kw)
    assert kw == dict(matrix_approximation_rank=4, start_powerSGD_iter=10, min_compression_rate=1.5,
                      use_error_feedback=True, warm_start=True, orthogonalization_epsilon=1e-8,
                      random_seed=3, compression_stats_logging_frequency=100,
                      batch_tensors_with_same_shape=False, timeout=30.0, pipeline=None)
    assert all(type(v) in (int, float, bool, type(None)) for v in kw.values()), kw


def test_the_hook_refuses_a_state_that_is_not_lowranks():
    """PyTorch's own PowerSGDState (or anything else) given to lowrank's hook: a TypeError that
    says which state to make, at the first call, before the bucket is touched."""
    from lowrank.torch import powerSGD_hook

    class PowerSGDStateOfAnotherLibrary:
        pass
    with pytest.raises(TypeError) as e:
        powerSGD_hook(PowerSGDStateOfAnotherLibrary(), object())
    assert "takes a lowrank.torch.PowerSGDState" in str(e.value)
    assert "PowerSGDStateOfAnotherLibrary" in str(e.value)


def test_model_must_be_a_module():
    with pytest.raises(TypeError):
        TensorRanks(exclude=["x"], model=object())


def test_rules_resolve_to_identities():
    """Names, parameters and functions resolve to the parameters' identities; exclude wins over
    rank_of; a tied parameter answers to each of its names."""
    m = _Tiny()
    m.head.weight = m.embed.weight  # tied: (8, 4) both
    r = TensorRanks(exclude=["head.weight"], rank_of={"embed.weight": 3, m.head.bias: 1}, model=m)
    got = r.resolve()
    assert got[(m.embed.weight.device.type, None, m.embed.weight.data_ptr(), (8, 4))] == 0
    bias = m.head.bias
    assert got[(bias.device.type, None, bias.data_ptr(), (8,))] == 1
    r = TensorRanks(rank_of=lambda name, p: 2 if p.dim() > 1 else None, model=m)
    assert sorted(r.resolve().values()) == [-1, 2]
    assert TensorRanks().empty and not r.empty
