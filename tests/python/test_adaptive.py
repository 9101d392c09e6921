"""lowrank.torch.adaptive.AdaptiveRank on synthetic signals: it switches where the gradient norm
changes by eta or more, or the compression error reaches error_max, and nowhere else; measured
and decided steps follow window and lag; the same numbers give the same ks (what lets every comm
rank switch alike); bad arguments are clear errors. Also signals.residuals against lowrank's own
format-2 bytes."""
import math
import random

import numpy as np
import pytest

import lowrank
from lowrank.torch.adaptive import AdaptiveRank
from lowrank.torch.signals import residuals


def drive(rule, norms, errors=None):
    """The ks the rule gives one parameter, decision by decision, for a series of norms."""
    errors = errors or [0.0] * len(norms)
    return [rule.decide({"p": (n, e)})["p"] for n, e in zip(norms, errors)]


def test_switches_at_norm_changes_only():
    rule = AdaptiveRank(low=2, high=8, eta=0.5, error_max=None)
    rng = random.Random(5)
    norms = [10 * (1 + rng.uniform(-0.1, 0.1)) for _ in range(6)]  # quiet: within 10%
    norms += [norms[-1] * 1.8]                                      # a jump of 80%
    norms += [norms[-1] * (1 + rng.uniform(-0.1, 0.1)) for _ in range(4)]
    norms += [norms[-1] * 0.4]                                      # a drop of 60%
    ks = drive(rule, norms)
    jumps = {0, 6, 11}  # the first measurement is critical; then the two changes
    assert ks == [8 if i in jumps else 2 for i in range(len(norms))]


def test_threshold_is_relative_and_inclusive():
    rule = AdaptiveRank(low=1, high=4, eta=0.5, error_max=None)
    # +50% (exactly, in binary) is critical, +33% and +40% are not
    assert drive(rule, [4.0, 6.0, 8.0, 12.0, 16.8]) == [4, 4, 1, 4, 1]


def test_error_keeps_high_rank():
    rule = AdaptiveRank(low=1, high=4, eta=0.5, error_max=0.8)
    ks = drive(rule, [1.0] * 6, errors=[0.1, 0.2, 0.85, 0.79, 0.8, 0.3])
    assert ks == [4, 1, 4, 1, 4, 1]


def test_parameters_are_independent():
    rule = AdaptiveRank(low=1, high=4, eta=0.5, error_max=None)
    rule.decide({"a": (1.0, 0.0), "b": (1.0, 0.0)})
    assert rule.decide({"a": (1.0, 0.0), "b": (3.0, 0.0)}) == {"a": 1, "b": 4}
    # a parameter seen for the first time later is critical, the others go on
    assert rule.decide({"a": (1.0, 0.0), "b": (3.0, 0.0), "c": (5.0, 0.0)}) == \
        {"a": 1, "b": 1, "c": 4}


def test_same_numbers_same_ranks():
    """Two rules (two comm ranks) fed the same allreduced numbers decide alike at every step."""
    rng = random.Random(11)
    series = [{p: (rng.lognormvariate(0, 0.6), rng.random()) for p in "abc"} for _ in range(40)]
    r0, r1 = AdaptiveRank(low=1, high=4, error_max=0.9), AdaptiveRank(low=1, high=4, error_max=0.9)
    d0, d1 = [r0.decide(s) for s in series], [r1.decide(s) for s in series]
    assert d0 == d1
    assert len({k for d in d0 for k in d.values()}) == 2  # both ranks used: a real series


@pytest.mark.parametrize("window,lag", [(1, 1), (3, 1), (4, 2), (100, 1)])
def test_window_and_lag(window, lag):
    rule = AdaptiveRank(window=window, lag=lag)
    measured = [t for t in range(300) if rule.measures(t)]
    assert measured == list(range(window - 1, 300, window))
    for t in range(300):
        m = rule.decides(t)
        assert m == (t - lag if t - lag in measured else None)


def test_bind_fills_low_and_high_in_a_copy():
    given = AdaptiveRank()
    rule = given.bind(2)
    assert (rule.low, rule.high, rule.initial()) == (2, 8, 8)
    assert (given.low, given.high) == (None, None), "the caller's rule is left as it was"
    assert given.bind(8).high == 32, "so it may serve another state with another k"
    rule = AdaptiveRank(high=3).bind(2)
    assert (rule.low, rule.high) == (2, 3)
    with pytest.raises(ValueError, match="below"):
        AdaptiveRank(high=1).bind(2)
    with pytest.raises(ValueError, match="above 65536"):
        AdaptiveRank().bind(20000)


@pytest.mark.parametrize("kwargs,word", [
    (dict(low=0), "low=0"), (dict(high=True), "high=True"), (dict(low=4, high=2), "below"),
    (dict(window=0), "window=0"), (dict(lag=0), "lag=0"), (dict(lag=1.5), "lag=1.5"),
    (dict(eta=-1), "eta=-1"), (dict(eta=math.inf), "eta=inf"), (dict(error_max=0), "error_max=0"),
])
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError) as e:
        AdaptiveRank(**kwargs)
    assert word in str(e.value)


def test_residuals_read_lowrank_bytes():
    """The residual of each id, read from save_state's format-2 bytes, is what lowrank holds:
    after one call of a rank-1 tensor, |E + out|^2 = |G|^2 on a single comm rank (M = G), and
    the residual of a 1-D tensor is 0."""
    uid = lowrank.get_unique_id()
    with lowrank.Communicator.init_rank(1, uid, 0, approx_rank=1, seed=3) as comm:
        g = np.random.default_rng(0).standard_normal(20 * 30 + 20).astype(np.float32)
        buf = g.copy()
        comm.set_tensors(buf, [(7, (20, 30)), (8, (20,))])
        comm.allreduce(buf, op="avg")
        res = residuals(comm.save_state(buf))
        assert sorted(res) == [7, 8]
        e = res[7].numpy()
        assert e.shape == (600,) and np.abs(e).max() > 0
        np.testing.assert_allclose(e + buf[:600], g[:600], rtol=0, atol=1e-5)
        assert not np.any(res[8].numpy())
    with pytest.raises(ValueError):
        residuals(b"LRSTATE\0" + (1).to_bytes(4, "little") + bytes(40))


def test_memory_round_trip():
    """A rule loaded with another's state_dict decides the next step as that one does (a
    restart); a malformed memory is a ValueError."""
    a = AdaptiveRank(low=1, high=4)
    a.decide({"p": (1.0, 0.0)})
    b = AdaptiveRank(low=1, high=4)
    b.load_state_dict(a.state_dict())
    fresh = AdaptiveRank(low=1, high=4)
    nxt = {"p": (1.1, 0.0)}
    assert b.decide(dict(nxt)) == a.decide(dict(nxt)) == {"p": 1}
    assert fresh.decide(dict(nxt)) == {"p": 4}  # without the memory: critical
    for bad in (None, {"norms": [1.0]}, {"norms": {"p": "x"}}):
        with pytest.raises(ValueError):
            AdaptiveRank().load_state_dict(bad)


def test_window_sums_accumulate_and_reset():
    """accumulate adds each declared tensor's part of a bucket into its window sum, by id (the
    ids' order in the bucket does not matter across calls); take_norms gives |sum|^2 and starts
    the next window from zero."""
    import torch
    from lowrank.torch.signals import accumulate, take_norms
    acc = {}
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # id 7: 2x2, id 9: 2 elements
    accumulate(acc, a, [7, 9], [(2, 2), (2,)])
    b = torch.tensor([5.0, 6.0, 1.0, 1.0, 1.0, 1.0])   # the next step: id 9 first
    accumulate(acc, b, [9, 7], [(2,), (2, 2)])
    got = take_norms(acc, [7, 9])
    assert got[7] == pytest.approx((1 + 1) ** 2 + (2 + 1) ** 2 + (3 + 1) ** 2 + (4 + 1) ** 2)
    assert got[9] == pytest.approx((5 + 5) ** 2 + (6 + 6) ** 2)
    assert acc == {}
    accumulate(acc, a, [7, 9], [(2, 2), (2,)])  # a new window: this step alone
    assert take_norms(acc, [7, 9, 11]) == pytest.approx({7: 30.0, 9: 61.0, 11: 0.0})


def test_error_test_is_off_by_default():
    """The default rule ignores the compression error (it is near 1 wherever error feedback
    runs: docs/pytorch.md); a quiet parameter goes low whatever its error."""
    rule = AdaptiveRank(low=1, high=4)
    assert rule.error_max is None
    assert drive(rule, [1.0, 1.1, 1.0], [1.0, 1.0, 1.0]) == [4, 1, 1]
