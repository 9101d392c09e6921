"""Issue 44's accuracy plan (studies/accuracy/plan_alternate.toml): the verdict rule of
studies/accuracy/report_alternate.py, the lowrank-alternate label (studies/lib/runlabel.py), and
the runner's arms (studies/accuracy/run.py --plan alternate). No training: fabricated run JSON.

  PYTHONPATH=.:python /usr/bin/python3 -m pytest -q tests/studies/test_accuracy_alternate.py
"""
import json

import pytest

from studies.accuracy import report_alternate as ra
from studies.accuracy import run as accuracy_run
from studies.lib import plan as planfile
from studies.lib import runlabel, stats


def test_decide_follows_the_plans_rule():
    delta = 0.005
    # D = 0.001, sd 0.001, n 4: U = 0.001 + t(0.95, 3) * 0.0005 = 0.00218 < delta
    t = ra.decide([0.0, 0.001, 0.002, 0.001], delta, 0.05)
    assert t["verdict"] == "non-inferior" and t["n"] == 4
    assert t["U"] == pytest.approx(0.001 + stats.t_quantile(0.95, 3) * stats.mean_se([0, .001, .002, .001]).se)
    assert t["L"] == pytest.approx(2 * t["D"] - t["U"])
    # clearly worse by more than delta
    assert ra.decide([0.010, 0.011, 0.012], delta, 0.05)["verdict"] == "inferior"
    # straddles delta
    u = ra.decide([0.0, 0.010, -0.004, 0.012], delta, 0.05)
    assert u["verdict"] == "undecided" and u["L"] <= delta <= u["U"]
    # every d the same: U = L = D (the plan's words), decided on D alone
    same = ra.decide([1 / 359] * 6, delta, 0.05)
    assert same["U"] == same["L"] == pytest.approx(1 / 359) and same["verdict"] == "non-inferior"
    assert any("L > 0" in f and "within the margin" in f for f in same["facts"])
    assert any("U < 0" in f for f in ra.decide([-0.01, -0.011, -0.012], delta, 0.05)["facts"])
    # fewer than two seeds: no SE, undecided
    assert ra.decide([0.0], delta, 0.05)["verdict"] == "undecided"
    assert ra.decide([], delta, 0.05)["verdict"] == "undecided"


def test_worse_by_sign_per_model():
    assert ra.worse_by("cnn", 0.98, 0.97) == pytest.approx(0.01)         # accuracy lost
    assert ra.worse_by("transformer", 2.20, 2.25) == pytest.approx(0.05)  # loss gained


def test_runlabel_keeps_alternate_apart():
    assert runlabel.reducer({"reducer": "lowrank", "alternate": True}) == "lowrank-alternate"
    assert runlabel.reducer({"reducer": "lowrank", "alternate": False}) == "lowrank"
    assert runlabel.reducer({"reducer": "lowrank"}) == "lowrank"  # runs before the flag
    assert runlabel.has_rank("lowrank-alternate")


def test_runlabel_and_runner_keep_factor_dtype_apart():
    """Issue 45's arms: the factor dtype is a suffix of the label, fp32 (or no field: runs before
    the option) none; the runner turns a label back into the driver's arguments."""
    assert runlabel.reducer({"reducer": "lowrank", "factor_dtype": "bf16"}) == "lowrank-bf16"
    assert runlabel.reducer({"reducer": "lowrank", "factor_dtype": "fp32"}) == "lowrank"
    assert runlabel.reducer({"reducer": "lowrank", "alternate": True,
                             "factor_dtype": "bf16"}) == "lowrank-alternate-bf16"
    assert runlabel.has_rank("lowrank-alternate-bf16") and not runlabel.has_rank("lowrank-exact")
    assert accuracy_run.reducer_args("lowrank-bf16") == ["--reducer", "lowrank", "--factor-dtype", "bf16"]
    assert accuracy_run.reducer_args("lowrank-alternate-bf16") == [
        "--reducer", "lowrank", "--alternate", "--factor-dtype", "bf16"]
    assert accuracy_run.reducer_args("lowrank-exact") == ["--reducer", "lowrank-exact"]
    for bad in ("lowrank-bogus", "lowrank-bf16-alternate", "lowrank-ring"):  # no run carries these
        with pytest.raises(SystemExit, match="not one the driver's runs carry"):
            accuracy_run.reducer_args(bad)
    assert runlabel.reducer({"reducer": "lowrank", "factor_dtype": "bfloat16"}) == "lowrank-bf16"
    assert runlabel.reducer({"reducer": "lowrank", "factor_dtype": "Float32"}) == "lowrank"
    p = planfile.load(accuracy_run.__file__, "plan_bf16.toml")
    assert p["reference"] == ["lowrank", 2] and p["arms"] == [["lowrank", 2], ["lowrank-bf16", 2]]


def test_model_bits_of_lowrank_variants():
    """train.model_bits_per_step: bf16 halves the factors' bits, alternating sends half of P + Q
    on average; the exact part stays 32 bits."""
    from studies.train import train
    shapes = [(64, 32, 3, 3), (64,)]
    pq, exact, _, _ = train.powersgd_split(shapes, 4)
    r = train.ring_factor(4)
    bits = lambda name: train.model_bits_per_step(name, shapes, 4, 4, True)
    assert bits("lowrank") == pytest.approx((32 * pq + 32 * exact) * r)
    assert bits("lowrank-bf16") == pytest.approx((16 * pq + 32 * exact) * r)
    assert bits("lowrank-alternate") == pytest.approx((16 * pq + 32 * exact) * r)
    assert bits("lowrank-alternate-bf16") == pytest.approx((8 * pq + 32 * exact) * r)
    assert bits("lowrank-exact") == pytest.approx(32 * (64 * 32 * 9 + 64) * r)


def test_plan_load_by_name_and_runner_arms():
    p = planfile.load(accuracy_run.__file__, "plan_alternate.toml")
    assert p["reference"] == ["lowrank", 2] and ["lowrank-alternate", 4] in p["arms"]
    assert accuracy_run.configs([1], p["arms"]) == [("lowrank", 2), ("lowrank-alternate", 2),
                                                    ("lowrank-alternate", 4)]
    assert accuracy_run.reducer_args("lowrank-alternate") == ["--reducer", "lowrank", "--alternate"]
    assert accuracy_run.reducer_args("lowrank") == ["--reducer", "lowrank"]
    assert accuracy_run.name("cnn", "lowrank-alternate", 2, 0) == "cnn_lowrank-alternate_r2_s0"


def _run(model, alternate, k, seed, metric):
    e = {"bits_cumulative": 1e6, "batch_ms": [1.0], "test_loss": metric}
    if model == "cnn":
        e["test_accuracy"] = metric
    return {"config": {"model": model, "reducer": "lowrank", "alternate": alternate, "rank": k,
                       "seed": seed},
            "epochs": [e, e], "machine": {"executable": "py", "env": {"LOWRANK_LIBRARY": "/x.so"}},
            "provenance": {"revision": "r", "library": {"library": "/x.so", "sha256": "abc"}}}


def test_summary_pairs_seeds_and_leaves_out_incomplete(tmp_path, monkeypatch):
    monkeypatch.setattr(ra.provenance, "check_run", lambda *a: None)
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed in range(ra.PLAN["seeds"]["cnn"]):
        for alt, k, acc in ((False, 2, 0.98), (True, 2, 0.979), (True, 4, 0.981)):
            if (seed, alt, k) == (5, True, 4):
                continue  # seed 5 misses an arm: left out of both of the CNN's tests
            (runs / f"cnn_{alt}_{k}_{seed}.json").write_text(json.dumps(_run("cnn", alt, k, seed, acc + seed / 1e4)))
    arms, tests, prov = ra.report(str(tmp_path))
    cnn = [t for t in tests if t["model"] == "cnn"]
    assert [t["label"] for t in cnn] == ["lowrank-alternate k=2", "lowrank-alternate k=4"]
    assert all(t["n"] == 5 and t["left_out"] == {"5": ["lowrank-alternate k=4"]} for t in cnn)
    assert cnn[0]["D"] == pytest.approx(0.001) and cnn[0]["verdict"] == "non-inferior"
    assert cnn[1]["D"] == pytest.approx(-0.001) and "U < 0" in cnn[1]["facts"][0]
    tr = [t for t in tests if t["model"] == "transformer"]
    assert all(t["verdict"] == "undecided" and t["n"] == 0 for t in tr)
    assert prov["distinct"]["library_sha256"] == ["abc"]
    md = (tmp_path / "summary.md").read_text()
    assert "non-inferior" in md and json.loads((tmp_path / "summary.json").read_text())["tests"]
