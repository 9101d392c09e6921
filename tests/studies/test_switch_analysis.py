"""studies/switch/analysis.py and report.py on synthetic per-run data whose ratios are
known: the intervals cover them at about their stated rate, pairing by run removes the run's own
speed, the decision rule decides as written, and the report names its inputs."""
import json
import math
import os
import random
import statistics as st

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from studies.lib import stats
from studies.switch import analysis as sa
from studies.switch import report as switch_report

NAMES = ["local", "allreduce", "fp16", "torch-powersgd", "lowrank"]
DROP = 2


# a provenance record that studies/lib/provenance.py's check_run keeps: the library built from
# the run's own revision, clean
PROVENANCE = dict(revision="a" * 40, library=dict(revision="a" * 40, sources_dirty=False,
                                                  sources_digest="d" * 64, sha256="5" * 64))


def make_run(ms, rng, steps=12, git="0123abc", setting="100mbit", world=2, rank=4,
             identical=True, model=None, payload=None):
    """A switching run's JSON: reducer -> true ms per batch; every kept step that time times
    lognormal noise; warm-up blocks and each block's first DROP steps absurdly slow, so any of
    them in a result shows. model, payload: reducer -> bytes per step per rank."""
    model, payload = model or {}, payload or {}
    ranks = []
    for r in range(world):
        blocks = [dict(reducer=n, warmup=True, batch_ms=[1e6] * 3, cpu_ms=[1.0] * 3,
                       run_delay_ms=[0.0] * 3, model_bytes_per_step=model.get(n, 0.0),
                       bytes=dict(process=dict(bytes_sent=0, bytes_retrans=0))) for n in ms]
        for n in list(ms) + list(ms)[::-1]:
            times = [1e6] * DROP + [ms[n] * math.exp(rng.gauss(0, 0.02)) for _ in range(steps - DROP)]
            retrans = 777
            blocks.append(dict(reducer=n, warmup=False, batch_ms=times, cpu_ms=[1.0] * steps,
                               run_delay_ms=[0.5] * steps, model_bytes_per_step=model.get(n, 0.0),
                               bytes=dict(process=dict(bytes_sent=payload.get(n, 0) * steps + retrans,
                                                       bytes_retrans=retrans))))
        ranks.append(dict(rank=r, blocks=blocks))
    return dict(kind="switch", config=dict(drop_steps=DROP, world=world, rank=rank, setting=setting),
                machine=dict(git=git), provenance=PROVENANCE, replicas_identical=identical,
                ranks=ranks)


def study(rng, n_runs, local, over, sd_run=0.3, sd_over=0.0):
    """n_runs runs: each run's machine speed a factor exp(N(0, sd_run)) on every reducer alike
    (the between-run variance pairing must remove); overheads `over` (reducer -> ms) times a
    per-run factor exp(N(0, sd_over))."""
    runs = []
    for _ in range(n_runs):
        speed = math.exp(rng.gauss(0, sd_run))
        ms = {"local": local * speed}
        for name, o in over.items():
            ms[name] = (local + o * math.exp(rng.gauss(0, sd_over))) * speed
        runs.append(make_run(ms, rng))
    return [sa.run_summary(r) for r in runs]


def test_run_summary_keeps_only_measured_steps():
    rng = random.Random(1)
    run = make_run({"local": 50.0, "lowrank": 60.0}, rng)
    s = sa.run_summary(run)
    kept = [t for b in run["ranks"][0]["blocks"] if not b["warmup"] and b["reducer"] == "lowrank"
            for t in b["batch_ms"][DROP:]]
    assert s["lowrank"]["mean_ms"] == pytest.approx(st.mean(kept))
    assert s["lowrank"]["median_ms"] == pytest.approx(st.median(kept))
    assert s["lowrank"]["steps"] == len(kept)


def test_bytes_against_model():
    rng = random.Random(2)
    floor, model = 1000, {"allreduce": 3_000_000, "lowrank": 80_000}
    payload = {"local": floor, "allreduce": floor + model["allreduce"],
               "lowrank": floor + int(1.04 * model["lowrank"])}
    run = make_run({"local": 50.0, "allreduce": 90.0, "lowrank": 55.0}, rng,
                   model=dict(model, local=0.0), payload=payload)
    table = sa.compare([sa.run_summary(run)])
    world = run["config"]["world"]
    assert table["allreduce"]["bytes_vs_model"][0] == pytest.approx(0.0, abs=1e-9)
    assert table["lowrank"]["bytes_vs_model"][0] == pytest.approx(
        int(1.04 * model["lowrank"]) / model["lowrank"] - 1)
    assert table["lowrank"]["model_bytes_per_step"] == pytest.approx(world * model["lowrank"])
    assert table["lowrank"]["retrans_per_step"] > 0  # counted apart, not in the payload


def test_pairing_removes_run_speed():
    """Runs differing by 30% in speed, overheads exact: the ratio to local and the ratio of
    overheads come out nearly exact, as they could not from unpaired means."""
    rng = random.Random(3)
    sums = study(rng, 8, 40.0, {"lowrank": 10.0, "torch-powersgd": 50.0}, sd_run=0.3)
    table = sa.compare(sums)
    r = table["lowrank"]["ratio_to_local"]
    assert r.low < 50 / 40 < r.high and r.high - r.low < 0.05
    f = stats.paired_fieller_ratio(sa.overheads(sums, "lowrank"), sa.overheads(sums, "torch-powersgd"))
    assert f.low < 0.2 < f.high  # the run's speed scales both overheads alike: their ratio stays 0.2


@pytest.mark.parametrize("kind", ["log_ratio", "fieller"])
def test_coverage(kind):
    """Over 400 simulated studies of 8 runs, the 95% interval holds the true value 91-99% of
    the time (binomial spread around 95% at 400 studies: about 1.1 points)."""
    rng = random.Random(4)
    rho, hits, n_studies = 0.25, 0, 400
    for _ in range(n_studies):
        a, b, num, den = [], [], [], []
        for _ in range(8):
            ob = 40.0 + rng.gauss(0, 6)
            a.append(rho * ob + rng.gauss(0, 2))
            b.append(ob)
            base = 50 * math.exp(rng.gauss(0, 0.3))
            den.append(base)
            num.append(base * 1.2 * math.exp(rng.gauss(0, 0.05)))
        if kind == "fieller":
            f = stats.paired_fieller_ratio(a, b, sa.CONFIDENCE)
            hits += f.low <= rho <= f.high
        else:
            r = stats.paired_ratio(num, den, sa.CONFIDENCE)
            hits += r.low <= 1.2 <= r.high
    assert 0.91 <= hits / n_studies <= 0.99, hits


def test_decision_rule():
    rng = random.Random(5)

    def overheads(n, rho, sd=1.0, ob=40.0):
        b = [ob + rng.gauss(0, 3) for _ in range(n)]
        return [rho * x + rng.gauss(0, sd) for x in b], b

    assert sa.decide(*overheads(8, 0.1), 1 / 3)[0] == "MET"
    assert sa.decide(*overheads(8, 0.6), 1 / 3)[0] == "NOT MET"
    verdict, why = sa.decide(*overheads(5, 0.1), 1 / 3)
    assert verdict == "UNDECIDED" and "fewer than" in why  # too few runs, however clear
    a, _ = overheads(8, 0.1)
    b = [rng.gauss(0, 5) for _ in range(8)]  # the baseline's overhead indistinguishable from 0
    assert sa.decide(a, b, 1 / 3)[0] == "UNDECIDED"
    # At the boundary: UNDECIDED exactly when the interval holds the target.
    for _ in range(50):
        a, b = overheads(8, 1 / 3, sd=4.0)
        f = stats.paired_fieller_ratio(a, b, sa.CONFIDENCE)
        verdict = sa.decide(a, b, 1 / 3)[0]
        assert (verdict == "UNDECIDED") == (f.low <= 1 / 3 <= f.high)


def test_decision_equals_contrast_test():
    """MET iff the t-interval of overhead_a - target * overhead_b lies below 0 (denominator
    clearly positive): the ratio's interval and the contrast's test are one rule."""
    rng = random.Random(6)
    for _ in range(300):
        n, rho, target = rng.randint(6, 12), rng.uniform(0, 0.8), rng.choice([0.1, 1 / 3])
        b = [30 + rng.gauss(0, 4) for _ in range(n)]
        a = [rho * x + rng.gauss(0, 3) for x in b]
        if not stats.paired_fieller_ratio(a, b, sa.CONFIDENCE).bounded:
            continue
        hi = stats.mean_interval([x - target * y for x, y in zip(a, b)], sa.CONFIDENCE).high
        assert (sa.decide(a, b, target)[0] == "MET") == (hi < 0)


def test_usable():
    rng = random.Random(7)
    assert sa.usable(make_run({"local": 1.0}, rng))[0]
    assert not sa.usable(make_run({"local": 1.0}, rng, git="0123abc-dirty"))[0]
    assert not sa.usable(make_run({"local": 1.0}, rng, identical=False))[0]


def test_report(tmp_path):
    rng = random.Random(8)
    files = []
    for i in range(7):
        speed = math.exp(rng.gauss(0, 0.2))
        ms = {n: v * speed for n, v in
              dict(local=40.0, allreduce=240.0, fp16=120.0, **{"torch-powersgd": 70.0}, lowrank=43.0).items()}
        run = make_run(ms, rng, git="0123abc-dirty" if i == 6 else "0123abc")
        files.append(str(tmp_path / f"run{i}.json"))
        with open(files[-1], "w") as f:
            json.dump(run, f)
    lines, summary = switch_report.report(files)
    text = "\n".join(lines)
    assert text.startswith("Report at revision ")
    for f in files:
        assert f in text
    assert f"Left out: {files[6]}: uncommitted changes" in text
    (key, s), = summary.items()
    assert len(s["runs"]) == 6 and s["libraries"] == ["5" * 64]  # the runs' library, by its record
    verdicts = {t["pair"]: t["verdict"] for t in s["targets"]}
    # Overhead ratio built in: 3/30 = 0.1 against lowrank <= 1/3 x torch-powersgd (met). The plan's
    # other pairs name reducers not in these runs (bf16, alternating): undecided, never met
    want = {(a, b): "UNDECIDED" for a, b, _ in sa.TARGETS}
    assert ("lowrank", "torch-powersgd") in want
    want[("lowrank", "torch-powersgd")] = "MET"
    assert verdicts == want
    assert "**MET**" in text


def test_ss_and_link_counts_beside():
    rng = random.Random(9)
    run = make_run({"local": 50.0, "lowrank": 55.0}, rng)
    for r in run["ranks"]:
        for b in r["blocks"]:
            n = len(b["batch_ms"])
            b["bytes"]["host_ss"] = dict(bytes_sent=1000 * n, bytes_acked=1000 * n, connections=0)
            b["bytes"]["link"] = dict(tx_bytes=1500 * n, tx_packets=n, rx_bytes=0, rx_packets=0)
    table = sa.compare([sa.run_summary(run)])
    world = len(run["ranks"])
    assert table["lowrank"]["ss_bytes_per_step"] == pytest.approx(1000 * world)
    assert table["lowrank"]["link_bytes_per_step"] == pytest.approx(1500 * world)
    plain = sa.compare([sa.run_summary(make_run({"local": 50.0}, rng))])
    assert plain["local"]["ss_bytes_per_step"] is None and plain["local"]["link_bytes_per_step"] is None
