#!/usr/bin/env python3
"""The accuracy study's report (docs/training.md): from studies/accuracy/results/runs/*.json the
summary (final metric per configuration, the targets of issue 12, whose numbers are plan.toml's
[targets]) and the figures docs/img/train_*.png (matplotlib: Debian's python3-matplotlib; without
it the figures are skipped with a message).

  /usr/bin/python3 -m studies.accuracy.report [--results DIR] [--img DIR]

Writes RESULTS/summary.{json,md}.
"""
import argparse
import glob
import json
import os
import statistics
import sys

from studies.lib import plan as planfile
from studies.lib import provenance, runlabel
from studies.lib import stats
from studies.lib.launch import ROOT

PLAN = planfile.load(__file__)
TARGETS = PLAN["targets"]
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")  # --results
IMG = os.path.join(ROOT, "docs", "img")                                        # --img


# ---- summary -----------------------------------------------------------------------------------
def mean_se(xs):
    """(mean, standard error, n) over seeds (stats.mean_se); the SE None for one seed."""
    if len(xs) < 2:
        return statistics.fmean(xs), None, len(xs)
    m = stats.mean_se(xs)
    return m.mean, m.se, m.n


def load_runs():
    runs = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "runs", "*.json"))):
        with open(path) as f:
            d = json.load(f)
        provenance.check_run(d, PLAN, path)
        c = d["config"]
        reducer = runlabel.reducer(c)
        k = c["rank"] if runlabel.has_rank(reducer) else None
        runs.setdefault((c["model"], reducer, k), []).append(d)
    return runs


def final_metric(d):
    e = d["epochs"][-1]
    return e["test_accuracy"] if d["config"]["model"] == "cnn" else e["test_loss"]


def steady_ms(d):
    """Mean time per batch over every epoch but the first."""
    xs = [x for e in d["epochs"][1:] for x in e["batch_ms"]]
    return sum(xs) / len(xs) if xs else None


def summarize(ranks):
    runs = load_runs()
    rows = []
    for (model, reducer, k), ds in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        values = [final_metric(d) for d in ds]
        m, se, n = mean_se(values)
        t, tse, _ = mean_se([steady_ms(d) for d in ds])
        b, _, _ = mean_se([d["epochs"][-1]["bits_cumulative"] for d in ds])
        h = [e["hook_call_ms_mean"] for d in ds for e in d["epochs"][1:]
             if e.get("hook_call_ms_mean") is not None]
        rows.append(dict(model=model, reducer=reducer, rank=k, seeds=sorted(d["config"]["seed"] for d in ds),
                         n=n, metric="test_accuracy" if model == "cnn" else "test_loss",
                         values=values, mean=m, se=se, batch_ms=t, batch_ms_se=tse, bits_per_worker=b,
                         hook_call_ms=sum(h) / len(h) if h else None,
                         workers=ds[0]["config"]["world"], epochs=ds[0]["config"]["epochs"],
                         torch=ds[0]["machine"]["torch"]))
    targets = []

    def row(model, reducer, k=None):
        return next((r for r in rows if (r["model"], r["reducer"], r["rank"]) == (model, reducer, k)), None)

    def se_diff(a, b):
        """The standard error of mean(a) - mean(b), seeds independent (Welch's); None below 2 seeds."""
        if a["n"] < 2 or b["n"] < 2:
            return None
        return stats.welch_difference(a["values"], b["values"]).se

    for model in ("cnn", "transformer"):
        full = row(model, "allreduce")
        for k in ranks:
            # PyTorch's hook's accuracy: chained or waited, the same arithmetic (bit for bit in
            # tests/train/test_torch_baseline.py), so the waited runs stand in for it.
            low = row(model, "lowrank", k)
            tor = row(model, "torch-powersgd", k) or row(model, "torch-powersgd-waited", k)
            if full and low and k in TARGETS["vs_full_ranks"]:
                d = low["mean"] - full["mean"]
                if model == "cnn":
                    s = se_diff(low, full)
                    tol = max(TARGETS["cnn_points"], TARGETS["se_multiple"] * s) if s is not None \
                        else TARGETS["cnn_points"]
                    met = abs(d) <= tol
                    text = (f"CNN, lowrank rank {k} within max({100 * TARGETS['cnn_points']:g} points, "
                            f"{TARGETS['se_multiple']:g} SE) of full precision: "
                            f"{100 * low['mean']:.2f}% vs {100 * full['mean']:.2f}%, difference "
                            f"{100 * d:+.2f} points, tolerance {100 * tol:.2f}")
                else:
                    met = d <= TARGETS["transformer_relative"] * full["mean"]
                    text = (f"transformer, lowrank rank {k} within {100 * TARGETS['transformer_relative']:g}% "
                            f"of full precision's test loss: "
                            f"{low['mean']:.4f} vs {full['mean']:.4f} ({100 * d / full['mean']:+.2f}%)")
                targets.append(dict(model=model, rank=k, target="vs full precision", met=met, text=text,
                                    n=(low["n"], full["n"])))
            if low and tor:
                s = se_diff(low, tor)
                worse = (tor["mean"] - low["mean"]) if model == "cnn" else (low["mean"] - tor["mean"])
                met = worse <= (TARGETS["se_multiple"] * s if s is not None else 0.0)
                unit = "points" if model == "cnn" else "nats"
                scale = 100 if model == "cnn" else 1
                text = (f"{model}, rank {k}: lowrank {scale * low['mean']:.4g} vs PyTorch's hook "
                        f"{scale * tor['mean']:.4g}; lowrank worse by {scale * worse:+.3g} {unit}, "
                        f"{TARGETS['se_multiple']:g} SE = {scale * TARGETS['se_multiple'] * s:.3g}"
                        if s is not None else
                        f"{model}, rank {k}: lowrank {low['mean']:.4g} vs PyTorch's hook {tor['mean']:.4g} "
                        f"(one seed: no SE)")
                targets.append(dict(model=model, rank=k, target="vs PyTorch's hook", met=met, text=text,
                                    n=(low["n"], tor["n"])))
    return rows, targets


def time_table(rows):
    """The reference's table of time per batch (rows Full precision, Float16, Rank k; columns
    PyTorch and lowrank), from the accuracy runs: ms per batch, mean over seeds ± SE."""
    out = []
    for model in ("cnn", "transformer"):
        def cell(reducer, k=None):
            r = next((r for r in rows if (r["model"], r["reducer"], r["rank"]) == (model, reducer, k)), None)
            if r is None:
                return "—"
            return f"{r['batch_ms']:.1f} ± {r['batch_ms_se']:.1f}" if r["batch_ms_se"] is not None \
                else f"{r['batch_ms']:.1f}"
        if not any(r["model"] == model for r in rows):
            continue
        out += ["", f"### Time per batch, {model} (ms, mean over seeds ± SE; 16 workers sharing 2 "
                    "cores over loopback: compute-bound, not the network setting)", "",
                "| | PyTorch | lowrank |", "|---|---|---|",
                f"| Full precision | {cell('allreduce')} (DDP allreduce) | {cell('lowrank-exact')} (lowrank-exact) |",
                f"| Float16 | {cell('fp16')} (fp16_compress_hook) | — |"]
        ks = sorted({r["rank"] for r in rows if r["model"] == model and r["rank"]})
        for k in ks:
            out.append(f"| Rank {k} | {cell('torch-powersgd', k)} | {cell('lowrank', k)} |")
            if cell("torch-powersgd-waited", k) != "—":
                out.append(f"| Rank {k}, PyTorch's hook waited per bucket | "
                           f"{cell('torch-powersgd-waited', k)} | — |")
    return out


def verdict(t):
    """MET / NOT MET; a rule decided on more seeds than plan.toml's [seeds] says so: those seeds
    were added after a result (optional stopping), so it is not the plan's test."""
    planned = PLAN["seeds"][t["model"]]
    word = "MET" if t["met"] else "NOT MET"
    if max(t["n"]) > planned:
        word += (f" on seeds beyond the plan's {planned}, added after a result (optional stopping: "
                 "not the plan's test)")
    return word


def write_summary(rows, targets):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "summary.json"), "w") as f:
        json.dump(dict(rows=rows, targets=targets), f, indent=1)
    lines = ["# Accuracy study: summary", "",
             "Written by studies/accuracy/report.py from studies/accuracy/results/runs/*.json. Final metric: "
             "test accuracy (CNN) or test loss in nats per character (transformer) after the last "
             "epoch; mean over seeds ± standard error. Time per batch: epochs 2.. of every seed, all "
             "workers sharing this host's cores (not the time-per-batch setting). Bits: per worker, "
             "whole run (lowrank: its bytesSent; others: message sizes, docs/training.md).", "",
             "| model | reducer | rank | seeds | final metric | ± SE | ms/batch | bits per worker | hook call ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['reducer']} | {r['rank'] or '—'} | {r['n']} | "
                     f"{r['mean']:.4f} | {r['se']:.4f} | {r['batch_ms']:.1f} | {r['bits_per_worker']:.3g} | "
                     + (f"{r['hook_call_ms']:.1f}" if r['hook_call_ms'] is not None else "—") + " |"
                     if r["se"] is not None else
                     f"| {r['model']} | {r['reducer']} | {r['rank'] or '—'} | {r['n']} | "
                     f"{r['mean']:.4f} | — | {r['batch_ms']:.1f} | {r['bits_per_worker']:.3g} | — |")
    lines += time_table(rows)
    lines += ["", "## Targets", ""]
    lines += [f"- {verdict(t)}: {t['text']} (seeds {t['n'][0]} and {t['n'][1]})"
              for t in targets] or ["- no results yet"]
    with open(os.path.join(RESULTS, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- figures -------------------------------------------------------------------------------------
def plot(ranks):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: figures skipped (apt-get install python3-matplotlib, then "
              "/usr/bin/python3 -m studies.accuracy.report)")
        return
    runs = load_runs()
    if not runs:
        return
    os.makedirs(IMG, exist_ok=True)
    colours = {1: "tab:red", 2: "tab:orange", 4: "tab:green", 8: "tab:purple"}

    def curve(ds, key):
        n = min(len(d["epochs"]) for d in ds)
        ys = [[d["epochs"][i][key] for d in ds] for i in range(n)]
        return (list(range(1, n + 1)), [sum(y) / len(y) for y in ys], [min(y) for y in ys],
                [max(y) for y in ys])

    for model, key, ylabel in (("cnn", "test_accuracy", "test accuracy"),
                               ("transformer", "test_loss", "test loss (nats/char)")):
        if not any(m == model for m, _, _ in runs):
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        torch_hook = "torch-powersgd" if any(r == "torch-powersgd" and m == model
                                             for m, r, _ in runs) else "torch-powersgd-waited"
        for ax, (impl, reducer, exact) in zip(axes, (("PyTorch", torch_hook, "allreduce"),
                                                     ("lowrank", "lowrank", "lowrank-exact"))):
            for label, rk, style, colour in ((f"full precision ({exact})", (model, exact, None), "-", "black"),
                                             *(((f"rank {k}", (model, reducer, k), "-", colours.get(k)))
                                               for k in ranks)):
                if rk not in runs:
                    continue
                x, y, lo, hi = curve(runs[rk], key)
                ax.plot(x, y, style, color=colour, label=f"{label} ({len(runs[rk])} seeds)")
                ax.fill_between(x, lo, hi, color=colour, alpha=0.15)
            if impl == "PyTorch" and (model, "fp16", None) in runs:
                x, y, _, _ = curve(runs[(model, "fp16", None)], key)
                ax.plot(x, y, "--", color="tab:blue", label="float16")
            world = next(iter(ds for (m, _, _), ds in runs.items() if m == model))[0]["config"]["world"]
            ax.set_title(f"{impl}: {model}, {world} workers (seeds' mean; band: min-max)", fontsize=10)
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel(ylabel)
        if model == "cnn":
            axes[0].set_ylim(0.8, 1.0)
        fig.tight_layout()
        path = os.path.join(IMG, f"train_{model}_by_epoch.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print("wrote", os.path.relpath(path, ROOT))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (model, key, ylabel) in zip(axes, (("cnn", "test_accuracy", "test accuracy"),
                                               ("transformer", "test_loss", "test loss (nats/char)"))):
        world = None
        for (m, reducer, k), ds in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0)):
            if m != model:
                continue
            world = ds[0]["config"]["world"]
            _, y, _, _ = curve(ds, key)
            _, bits, _, _ = curve(ds, "bits_cumulative")
            marker = {"allreduce": "s", "lowrank-exact": "D", "fp16": "^", "torch-powersgd": "o",
                      "torch-powersgd-waited": "o", "lowrank": "x"}[reducer]
            colour = colours.get(k, "black") if k else {"fp16": "tab:blue"}.get(reducer, "black")
            style = ":" if reducer in ("torch-powersgd", "torch-powersgd-waited", "lowrank-exact") else "-"
            ax.plot(bits, y, style, marker=marker, color=colour, markersize=4,
                    label=reducer + (f" rank {k}" if k else "") + f" ({len(ds)} seeds)")
        ax.set_title(f"{model}, {world} workers: seeds' mean, per epoch", fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("bits communicated per worker, cumulative")
        if model == "cnn":
            ax.set_ylim(0.8, 1.0)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(IMG, "train_vs_bits.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote", os.path.relpath(path, ROOT))


def report(results, img, ranks):
    """Summary and figures of the runs under results/runs; RESULTS, IMG: those folders."""
    global RESULTS, IMG
    RESULTS, IMG = os.path.abspath(results), os.path.abspath(img)
    rows, targets = summarize(ranks)
    write_summary(rows, targets)
    plot(ranks)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=RESULTS, help="folder of runs/ and the summary")
    ap.add_argument("--img", default=IMG, help="folder of the figures")
    ap.add_argument("--ranks", nargs="+", type=int, default=PLAN["ranks"])
    args = ap.parse_args()
    runs = os.path.join(args.results, "runs")
    if not os.path.isdir(args.results):  # never create a results folder or write an empty summary
        sys.exit(f"studies.accuracy.report: no folder {args.results}")
    if not glob.glob(os.path.join(runs, "*.json")):
        sys.exit(f"studies.accuracy.report: no runs ({runs}/*.json) in {args.results}")
    report(args.results, args.img, args.ranks)


if __name__ == "__main__":
    main()
