#!/usr/bin/env python3
"""The rank study's report (the decisions in run.py's docstring, their numbers plan.toml's
[decisions]): the table of loss against bits, the equivalence tests, the other rules, the figures.

  /usr/bin/python3 -m studies.rank.report [--followup]

Writes studies/rank/results/{first,followup}/summary.{md,json} and docs/img/{rank,rank2}_*.png.
"""
import argparse
import glob
import json
import os

from studies.accuracy.report import final_metric, mean_se  # the accuracy study's, shared
from studies.lib import provenance
from studies.lib import stats
from studies.lib.launch import ROOT
from studies.rank.design import PLAN, Study, load

D = PLAN["decisions"]
EQ_ALPHA = (1 - D["eq_confidence"]) / 2  # each one-sided test's size: the 90% interval, tests at 5%
IMG = os.path.join(ROOT, "docs", "img")
S = Study("first")  # main() sets the follow-up


def bits_full(d):
    """Full precision's bits per worker over the run: DDP's allreduce, by the ring's model."""
    return d["epochs"][-1]["bits_cumulative"]


def collect():
    runs = {}
    for p in sorted(glob.glob(os.path.join(S.out, "*.json"))):
        if p.endswith("summary.json"):
            continue
        d = load(p)
        provenance.check_run(d, PLAN, p)
        base = os.path.basename(p)[:-5]
        model, rest = base.split("_", 1)
        config, seed = rest.rsplit("_s", 1)
        runs.setdefault((model, config), {})[int(seed)] = d
    return runs


def bits_16(d):
    """lowrank's payload by the ring model (bits per worker over the run) had it sent in 16 bits
    what it sends in 32 (not built): (the factors only: the exact warm-up steps and the tensors it
    leaves exact stay 32-bit; every element after the warm-up). From lowrank_stats: the warm-up
    steps send every parameter exact; None for other reducers."""
    st = d.get("lowrank_stats")
    if not st:
        return None
    warm = (st["calls"] - st["compressedCalls"]) * d["config"]["parameters"]
    exact, factors = st["exactElements"] - warm, st["payloadElements"] - st["exactElements"]
    unit = 32.0 * d["config"]["ring_factor"]
    return unit * (warm + exact + factors / 2), unit * (warm + (exact + factors) / 2)


def row(model, config, ds, full_bits):
    seeds = sorted(ds)
    vals = [final_metric(ds[s]) for s in seeds]
    m, se, _ = mean_se(vals)
    bits = [ds[s]["epochs"][-1]["bits_cumulative"] for s in seeds]
    after = [ds[s].get("bits_after_warmup") for s in seeds]
    # lowrank's payload at the ring's 2(N-1)/N, as the models of full precision and PyTorch's hook
    # count: its transport picks a latency-bound algorithm for the small factor messages, which
    # sends more than the ring would (bytesSent / payload is about 3.6 at 16 workers)
    ring = [ds[s]["lowrank_stats"]["payloadElements"] * 32.0 * ds[s]["config"]["ring_factor"]
            if ds[s].get("lowrank_stats") else ds[s]["epochs"][-1]["bits_cumulative"] for s in seeds]
    half = [bits_16(ds[s]) for s in seeds]
    half = [sum(h[i] for h in half) / len(half) / full_bits for i in (0, 1)] \
        if full_bits and all(half) else [None, None]
    revs = sorted({ds[s]["machine"].get("git", "?") for s in seeds})
    return dict(model=model, config=config, seeds=seeds, metric=m, se=se, values=vals,
                bits=sum(bits) / len(bits), bits_frac=(sum(bits) / len(bits)) / full_bits if full_bits else None,
                bits_after_warmup=(sum(after) / len(after)) if all(a is not None for a in after) else None,
                bits_ring=sum(ring) / len(ring),
                bits_ring_frac=(sum(ring) / len(ring)) / full_bits if full_bits else None,
                bits16_factors_frac=half[0], bits16_after_warmup_frac=half[1],
                rank_changes=[ds[s].get("lowrank_stats", {}).get("rankChanges") for s in seeds],
                revisions=revs)


def tost(a, b):
    """Paired (by seed) difference a - b of final metrics against the plan's margin, by two
    one-sided tests (stats.paired_tost): mean, the eq_confidence interval, equivalent? None
    below 2 seeds."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    t = stats.paired_tost([final_metric(a[s]) for s in seeds], [final_metric(b[s]) for s in seeds],
                          D["eq_margin"], alpha=EQ_ALPHA)
    return dict(seeds=seeds, diff=t.estimate, lo=t.interval[0], hi=t.interval[1], p=t.p,
                equivalent=t.equivalent)


def chord(ad, a, f0, f1, key, runs):
    """The adaptive configuration (row a, runs ad) against the straight line between the fixed
    rows f0 and f1 at a[key] (bits as a share of full's), per seed on the seeds all three have:
    dict(f0, f1, seeds, diff (loss minus the line's, nats), se, low, high (the interval at
    front_confidence), below (the plan's rule: diff < -front_se x SE)); None below 2 seeds."""
    w = 0.0 if f1[key] == f0[key] else (a[key] - f0[key]) / (f1[key] - f0[key])
    d0, d1 = runs[("transformer", f0["config"])], runs[("transformer", f1["config"])]
    seeds = sorted(set(ad) & set(d0) & set(d1))
    if len(seeds) < 2:
        return None
    diffs = [final_metric(ad[s]) - ((1 - w) * final_metric(d0[s]) + w * final_metric(d1[s]))
             for s in seeds]
    m, iv = stats.mean_se(diffs), stats.mean_interval(diffs, D["front_confidence"])
    return dict(f0=f0["config"], f1=f1["config"], seeds=seeds, diff=m.mean, se=m.se, low=iv.low,
                high=iv.high, below=m.mean < -D["front_se"] * m.se)


def bracket(fixed, value, key):
    """The neighbouring rows of `fixed` (sorted by key) around value: (below, above) or None."""
    lo = [f for f in fixed if f[key] <= value]
    hi = [f for f in fixed if f[key] >= value]
    return (lo[-1], hi[0]) if lo and hi else None


def paired(a, b):
    """a, b: {seed: run}. (seeds both have, a's mean, b's mean, SE of the per-seed a - b)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return seeds, None, None, None
    xa = [final_metric(a[s]) for s in seeds]
    xb = [final_metric(b[s]) for s in seeds]
    _, se, _ = mean_se([x - y for x, y in zip(xa, xb)])
    return seeds, sum(xa) / len(xa), sum(xb) / len(xb), se


def fixed_by(fixed, key):
    return sorted(fixed, key=lambda r: r[key])


def _front(below):
    return "below the front" if below else "not below the front"


def decisions(rows, runs):
    """The rules of the docstring applied to the runs, every comparison on the seeds both sides
    have (paired by seed: the same initial weights and data order; the full-precision runs differ
    by up to 0.2 nats between seeds, so means over other seed sets would mislead): markdown lines."""
    get = {(r["model"], r["config"]): r for r in rows}
    out = []
    full = runs.get(("transformer", "full"))
    if full:
        for r in rows:
            if r["model"] != "transformer" or r["config"][0] not in "ra":
                continue
            seeds, m, f, _ = paired(runs[("transformer", r["config"])], full)
            if not seeds or m > D["within_full"] * f:
                continue
            meets = r["bits_frac"] <= D["bits_budget"]
            half = ""  # what 16-bit sending would have cost (not built)
            if not meets and r["bits16_factors_frac"] is not None:
                half = (f"; in 16 bits, by the ring model: the factors alone {r['bits16_factors_frac']:.3f} of "
                        f"full's bits, every element after the 32-bit warm-up "
                        f"{r['bits16_after_warmup_frac']:.3f}")
            per_seed = ""  # the rule is on the means; the per-seed spread beside it
            if len(seeds) >= 2:
                ad, fd = runs[("transformer", r["config"])], full
                iv = stats.mean_interval([final_metric(ad[s]) / final_metric(fd[s]) - 1 for s in seeds],
                                         D["within_confidence"])
                per_seed = (f"; per seed, loss / full's - 1: mean {iv.estimate:+.2%} (SE {iv.se:.2%}; "
                            f"{iv.confidence:.0%} interval [{iv.low:+.2%}, {iv.high:+.2%}])")
            out.append(f"- transformer {r['config']}: within {D['within_full'] - 1:.0%} of full precision on seeds {seeds} "
                       f"({m:.4f} against {f:.4f}, {m / f - 1:+.2%}) at {r['bits_frac']:.3f} of its bits "
                       f"sent ({r['bits_ring_frac']:.3f} by the ring model): "
                       + ("meets" if meets else "misses") + f" the {D['bits_budget']:g} budget" + half
                       + per_seed)
    fixed = [r for r in rows if r["model"] == "transformer" and r["config"][:1] == "r"
             and r["config"][1:].isdigit()]
    for a in (r for r in rows if r["model"] == "transformer" and r["config"].startswith("a")):
        ad = runs[("transformer", a["config"])]
        for key, what in (("bits_frac", "bits sent"), ("bits_ring_frac", "ring model")):
            pair = bracket(fixed_by(fixed, key), a[key], key)
            if pair is None:
                out.append(f"- adaptive {a['config']} ({what}): outside the fixed ranks' range of bits")
                continue
            c = chord(ad, a, *pair, key, runs)
            if c is None:
                out.append(f"- adaptive {a['config']} ({what}): fewer than 2 seeds in common")
                continue
            out.append(f"- adaptive {a['config']} ({what}): at {a[key]:.3f} of full's bits (between "
                       f"{c['f0']} and {c['f1']}), loss minus the fixed front's on seeds {c['seeds']}: "
                       f"{c['diff']:+.4f} (SE {c['se']:.4f}; {D['front_confidence']:.0%} interval "
                       f"[{c['low']:+.4f}, {c['high']:+.4f}]): " + _front(c["below"]))
            # The same rule against the front built without one fixed rank (where that changes
            # the chord): whether the verdict rests on how the front is built.
            for left in fixed:
                rest = fixed_by([f for f in fixed if f is not left], key)
                other = bracket(rest, a[key], key)
                if other is None or [f["config"] for f in other] == [c["f0"], c["f1"]]:
                    continue
                o = chord(ad, a, *other, key, runs)
                if o is None:
                    continue
                out.append(f"  - without {left['config']} (between {o['f0']} and {o['f1']}, seeds "
                           f"{o['seeds']}): {o['diff']:+.4f} (SE {o['se']:.4f}; "
                           f"{D['front_confidence']:.0%} interval [{o['low']:+.4f}, {o['high']:+.4f}]): "
                           + _front(o["below"]) + ("" if o["below"] == c["below"] else
                                                   ": the verdict depends on how the front is built"))
    cf, cr = runs.get(("cnn", "full")), runs.get(("cnn", "r2"))
    for c in sorted(c for (m, c) in runs if m == "cnn" and c.startswith("a")):
        ca = runs[("cnn", c)]
        if not cf:
            break
        seeds, m, f, se = paired(ca, cf)
        tol = max(D["cnn_points"], D["cnn_se_multiple"] * (se or 0))
        ra = get[("cnn", c)]
        line = (f"- cnn {c}: accuracy {m:.4f} against full's {f:.4f} on seeds {seeds} (difference "
                f"{m - f:+.4f}, tolerance max({D['cnn_points']:g}, {D['cnn_se_multiple']:g} SE) = {tol:.4f}): "
                + ("within" if abs(m - f) <= tol else "outside"))
        if cr:
            rr = get[("cnn", "r2")]
            ok = ra["bits_after_warmup"] <= rr["bits_after_warmup"]
            line += (f"; bits after warm-up {ra['bits_after_warmup']:.3g} against fixed rank 2's "
                     f"{rr['bits_after_warmup']:.3g}: " + ("no more" if ok else "more"))
        out.append(line)
    return out


def report():
    if not glob.glob(os.path.join(S.out, "*.json")):
        print(f"no runs in {S.out}")
        return
    runs = collect()
    rows, lines = [], ["# Issue 28's " + ("follow-up study" if S.followup else "study") +
                       ": loss against bits (studies/rank/report.py" +
                       (" --followup)" if S.followup else ")"), ""]
    fullb = {m: (sum(bits_full(d) for d in runs[(m, "full")].values()) / len(runs[(m, "full")])
                 if (m, "full") in runs else None) for m in ("transformer", "cnn")}
    for (model, config), ds in sorted(runs.items()):
        if config.startswith("sgd-lr"):
            continue
        rows.append(row(model, config, ds, fullb[model]))
    lines += ["Bits per worker over the whole run: `sent` is lowrank's bytesSent (measured; full "
              "precision's and PyTorch's hook's are the ring model); `ring` is every reducer's payload at "
              "the ring's 2(N-1)/N (lowrank's payloadElements), the same model for all. `after warm-up`: "
              "lowrank's bytesSent from the first compressed step on.", "",
              "| model | config | seeds | final metric (mean +- SE) | vs full, same seeds | bits sent | of full's | "
              "ring model | of full's | after warm-up | rank changes | revisions |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # each against its own full-precision run: SGD's configurations against sgd-full
    full = {(r["model"], r["config"].startswith("sgd")): r for r in rows if r["config"] in ("full", "sgd-full")}
    for r in rows:
        se = f" +- {r['se']:.4f}" if r["se"] is not None else ""
        ref = full.get((r["model"], r["config"].startswith("sgd")))
        rel = "-"
        if ref:  # on the seeds both have
            _, m, f, _ = paired(runs[(r["model"], r["config"])], runs[(ref["model"], ref["config"])])
            rel = f"{m / f - 1:+.2%}" if m is not None else "-"
        frac = f"{r['bits_frac']:.3f}" if r["bits_frac"] else "-"
        rfrac = f"{r['bits_ring_frac']:.3f}" if r["bits_ring_frac"] else "-"
        aw = f"{r['bits_after_warmup']:.3g}" if r["bits_after_warmup"] else "-"
        rc = ",".join("-" if c is None else str(c) for c in r["rank_changes"])
        lines.append(f"| {r['model']} | {r['config']} | {len(r['seeds'])} | {r['metric']:.4f}{se} | {rel} | "
                     f"{r['bits']:.3g} | {frac} | {r['bits_ring']:.3g} | {rfrac} | {aw} | {rc} | "
                     f"{', '.join(r['revisions'])} |")
    sweep = {lr: final_metric(load(S.path("transformer", f"sgd-lr{lr}", S.sweep_seed)))
             for lr in S.sgd_lrs if os.path.exists(S.path("transformer", f"sgd-lr{lr}", S.sweep_seed))}
    if sweep:
        lines += ["", "SGD's learning-rate sweep (full precision, seed 100): " +
                  ", ".join(f"lr {lr}: {v:.4f}" for lr, v in sweep.items()) +
                  (f"; chosen {S.sgd_lr()}" if S.sgd_lr() else "; incomplete")]
    tests = {}
    if not S.followup:
        lines += ["", f"lowrank against PyTorch's hook (paired by seed, margin +-{D['eq_margin']} nats, "
                  "90% interval):", ""]
    for k in () if S.followup else D["equivalence_ranks"]:
        a, b = runs.get(("transformer", f"r{k}")), runs.get(("transformer", f"t{k}"))
        t = tost(a, b) if a and b else None
        tests[k] = t
        lines.append(f"- rank {k}: " + ("not enough seeds" if t is None else
                     f"{t['diff']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}] over seeds {t['seeds']}: "
                     + ("equivalent" if t["equivalent"] else "not shown equivalent")))
    rules = decisions(rows, runs)
    lines += ["", "The other rules of the docstring:", ""] + rules
    with open(os.path.join(S.out, "summary.json"), "w") as f:
        json.dump(dict(rows=rows, sgd_sweep=sweep, equivalence=tests, margin=D["eq_margin"], rules=rules),
                  f, indent=1)
    with open(os.path.join(S.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(runs, rows)


def plot(runs, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figures skipped")
        return
    os.makedirs(IMG, exist_ok=True)
    tr = [r for r in rows if r["model"] == "transformer" and r["config"] not in ("full",)
          and not r["config"].startswith("sgd")]
    full = next((r for r in rows if (r["model"], r["config"]) == ("transformer", "full")), None)
    if tr and full:
        fig, ax = plt.subplots(figsize=(6, 4))
        # y: the loss minus full precision's on the same seeds (paired), so that 3- and 5-seed
        # configurations compare alike; the bar is the SE of the per-seed differences
        colour = {"r": "C0", "t": "C1", "a": "C2"}
        fd = runs[("transformer", "full")]
        for r in tr:
            c = colour.get(r["config"][0], "C0")
            seeds, m, f, se = paired(runs[("transformer", r["config"])], fd)
            y = m - f
            ax.errorbar(r["bits_ring_frac"], y, yerr=se or 0, fmt="o", color=c, capsize=3)
            ax.annotate(r["config"], (r["bits_ring_frac"], y), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
            if r["bits_frac"] and abs(r["bits_frac"] - r["bits_ring_frac"]) > 1e-6:  # lowrank's sent bytes
                ax.plot([r["bits_frac"]], [y], "o", mfc="none", color=c)
        ax.axhline(0, color="k", lw=1, label="full precision")
        ax.axhline((D["within_full"] - 1) * full["metric"], color="k", lw=0.5, ls="--", label=f"+{D['within_full'] - 1:.0%} of its mean loss")
        ax.set_xlabel("bits per worker over the run / full precision's (filled: ring model;\n"
                      "hollow: lowrank's bytes sent). r: lowrank, t: PyTorch's hook, a: adaptive")
        ax.set_ylabel("final test loss minus full\nprecision's, same seeds (nats)")
        ax.set_title(f"transformer, {PLAN['workers']} workers (studies/rank/results/{os.path.basename(S.out)})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(IMG, f"{S.fig}_loss_bits.png"), dpi=110)
        plt.close(fig)
    ad = [(c, ds) for (m, c), ds in runs.items() if c.startswith("a") and 0 in ds and ds[0].get("rank_trace")]
    if ad:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for c, ds in ad:
            d = ds[0]
            total = d["config"]["total_steps"]
            xs, ys = [], []
            for step, ks in d["rank_trace"]:
                xs.append(step)
                ys.append(sum(ks.values()))
            xs.append(total)
            ys.append(ys[-1])
            ax.step(xs, ys, where="post", label=f"{d['config']['model']} {c} (seed 0)")
        ax.set_xlabel("step")
        ax.set_ylabel("sum of the tensors' k in force\n(0: exact; k = 16 leaves 64 x 64 exact)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(IMG, f"{S.fig}_adaptive_steps.png"), dpi=110)
        plt.close(fig)


def main():
    global S
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--followup", action="store_true", help="the follow-up study")
    args = ap.parse_args()
    S = Study("followup" if args.followup else "first")
    report()


if __name__ == "__main__":
    main()
