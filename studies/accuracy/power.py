#!/usr/bin/env python3
"""The margins and seeds of plan_alternate.toml (alternating PowerSGD against PowerSGD at k) and of
plan_bf16.toml (bf16 factors against fp32 factors at k), by a power calculation on the spreads the
accuracy study already measured (results/runs/*.json). Its printout is pasted, as comments, into
the plan; it runs nothing.

  /usr/bin/python3 -m studies.accuracy.power [--plan bf16]

The test (plan_alternate.toml, [rule]): per seed s, d_s = how much worse the alternating arm is
than PowerSGD at k (CNN: PowerSGD's test accuracy - the arm's; transformer: the arm's test loss -
PowerSGD's); non-inferior when mean(d) + t(0.95, n - 1) sd(d) / sqrt(n) < delta.
"""
import argparse
import glob
import json
import math
import os
import statistics
import warnings

from scipy.stats import nct

from studies.accuracy import report
from studies.lib import runlabel, stats

RUNS = os.path.join(report.RESULTS, "runs")
EST_S = {"cnn": 42, "transformer": 60}  # seconds per run (plan.toml's [estimate_s])
# Per plan: arms run per seed, the seconds a run takes, and the pairs of arms whose paired sd
# plans the seeds (the largest is taken).
PLANS = {
    # PowerSGD at k, alternating at k and at 2k; any two compressing arms at k 2 or 4 (alternation
    # changes the compressor more than a second implementation does)
    "alternate": dict(arms=3, est_s=EST_S, pairs=[
        (("lowrank", 2), ("torch-powersgd-waited", 2)), (("lowrank", 2), ("lowrank", 4)),
        (("lowrank", 4), ("torch-powersgd-waited", 4)), (("lowrank", 2), ("torch-powersgd-waited", 4))]),
    # fp32 and bf16 factors at k = 2: the same compressor perturbed, as a second implementation of
    # it is (two libraries' PowerSGD at the same k: their float sums differ); run times as measured
    # in results_alternate/run.log (lowrank k=2: CNN 50 s, transformer 52 s)
    "bf16": dict(arms=2, est_s={"cnn": 50, "transformer": 52}, pairs=[
        (("lowrank", 2), ("torch-powersgd-waited", 2)), (("lowrank", 4), ("torch-powersgd-waited", 4))]),
}


def finals(runs=RUNS):
    """{(model, reducer, k): {seed: final metric}} of the runs' JSON (report.final_metric)."""
    out = {}
    for path in glob.glob(os.path.join(runs, "*.json")):
        with open(path) as f:
            d = json.load(f)
        c = d["config"]
        r = runlabel.reducer(c)
        out.setdefault((c["model"], r, c["rank"] if runlabel.has_rank(r) else None),
                       {})[c["seed"]] = report.final_metric(d)
    return out


def paired_sd(f, a, b):
    """(seeds, sd) of the per-seed differences between arms a and b, seeds both have."""
    seeds = sorted(set(f[a]) & set(f[b]))
    return len(seeds), statistics.stdev(f[a][s] - f[b][s] for s in seeds)


def power(delta, sd, n, true_diff=0.0, alpha=0.05):
    """P(verdict non-inferior) with n seeds when d ~ N(true_diff, sd^2) per seed: the upper bound
    is below delta iff T = (delta - mean d) / (s / sqrt n) > t(1 - alpha, n - 1), and T is
    noncentral t with n - 1 df and noncentrality (delta - true_diff) sqrt(n) / sd. At
    true_diff = delta it is alpha (the test's size). scipy 1.10's nct warns at 2 or 3 df, yet
    its values agree with a simulation of 200000 studies to 0.002, so the warning is silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(nct.sf(stats.t_quantile(1 - alpha, n - 1), n - 1,
                            (delta - true_diff) * math.sqrt(n) / sd))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", choices=sorted(PLANS), default="alternate")
    p = PLANS[ap.parse_args().plan]
    f = finals()
    ref = {m: f[(m, "lowrank", 2)] for m in ("cnn", "transformer")}
    # delta: the study's own margins (plan.toml [targets]): CNN 0.5 points of accuracy; the
    # transformer 2% of the reference's test loss.
    delta = {"cnn": 0.005, "transformer": round(0.02 * statistics.fmean(ref["transformer"].values()), 3)}
    sd = {}
    for m in ("cnn", "transformer"):
        between = statistics.stdev(ref[m].values())
        print(f"{m}: PowerSGD k=2 over {len(ref[m])} seeds: mean {statistics.fmean(ref[m].values()):.4f}, "
              f"sd {between:.4f} (x sqrt 2, unpaired: {math.sqrt(2) * between:.4f}); delta {delta[m]}")
        sds = []
        for a, b in p["pairs"]:
            n, s = paired_sd(f, (m, *a), (m, *b))
            sds.append(s)
            print(f"  paired sd {a[0]} k={a[1]} - {b[0]} k={b[1]}: {s:.4f} ({n} seeds)")
        sd[m] = max(sds)  # planning sd: the largest of the plan's pairs
        print(f"  planning sd {sd[m]:.4f}")
    print("P(non-inferior) by seeds, at true difference 0 / delta/2; at 1.5 x planning sd, true 0:")
    for m in ("cnn", "transformer"):
        for n in range(3, 9):
            print(f"  {m} n={n}: {power(delta[m], sd[m], n):.2f} / {power(delta[m], sd[m], n, delta[m] / 2):.2f}"
                  f"; {power(delta[m], 1.5 * sd[m], n):.2f}  ({p['arms'] * n * p['est_s'][m] / 60:.1f} min)")


if __name__ == "__main__":
    main()
