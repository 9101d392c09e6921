#!/usr/bin/env python3
"""The margins and seeds of plan_alternate.toml (alternating PowerSGD against PowerSGD at k), by a
power calculation on the spreads the accuracy study already measured (results/runs/*.json).
Its printout is pasted, as comments, into the plan; it runs nothing.

  /usr/bin/python3 -m studies.accuracy.power

The test (plan_alternate.toml, [rule]): per seed s, d_s = how much worse the alternating arm is
than PowerSGD at k (CNN: PowerSGD's test accuracy - the arm's; transformer: the arm's test loss -
PowerSGD's); non-inferior when mean(d) + t(0.95, n - 1) sd(d) / sqrt(n) < delta.
"""
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
ARMS = 3                                # PowerSGD at k, alternating at k and at 2k


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
        pairs = [(("lowrank", 2), ("torch-powersgd-waited", 2)), (("lowrank", 2), ("lowrank", 4)),
                 (("lowrank", 4), ("torch-powersgd-waited", 4)), (("lowrank", 2), ("torch-powersgd-waited", 4))]
        sds = []
        for a, b in pairs:
            n, s = paired_sd(f, (m, *a), (m, *b))
            sds.append(s)
            print(f"  paired sd {a[0]} k={a[1]} - {b[0]} k={b[1]}: {s:.4f} ({n} seeds)")
        sd[m] = max(sds)  # planning sd: the largest between two compressing arms at k 2 or 4
        print(f"  planning sd {sd[m]:.4f}")
    print("P(non-inferior) by seeds, at true difference 0 / delta/2; at 1.5 x planning sd, true 0:")
    for m in ("cnn", "transformer"):
        for n in range(3, 9):
            print(f"  {m} n={n}: {power(delta[m], sd[m], n):.2f} / {power(delta[m], sd[m], n, delta[m] / 2):.2f}"
                  f"; {power(delta[m], 1.5 * sd[m], n):.2f}  ({ARMS * n * EST_S[m] / 60:.1f} min)")


if __name__ == "__main__":
    main()
