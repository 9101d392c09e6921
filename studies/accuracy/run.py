#!/usr/bin/env python3
"""The accuracy study of docs/training.md: the training driver (perf/train/train.py) over every
reducer but `local`, PowerSGD at ranks 1, 2 and 4 for both implementations, several seeds, 16
workers on this host; then the summary (final metric per configuration, the targets of issue 12)
and the figures.

Resumable: a configuration whose JSON exists is not rerun (the driver writes it whole, at the end).
Runs are ordered seed by seed, so a stopped study leaves every configuration with about as many
seeds as the others.

  # the runs (~70 min: CNN 42-60 s a run, transformer 60-115 s, on this 2-core machine), then
  # the summary and figures
  /usr/bin/python3 perf/train/study.py --python /opt/venv-t2/bin/python
  # only the summary and the figures from the JSON present
  /usr/bin/python3 perf/train/study.py --report-only
  # the plan, nothing run
  /usr/bin/python3 perf/train/study.py --dry-run

Writes perf/results/train/accuracy/<model>_<reducer>[_r<k>]_s<seed>.json (and .log), the summary
perf/results/train/accuracy_summary.{json,md}, and the figures docs/img/train_*.png (matplotlib:
Debian's python3-matplotlib; without it the figures are skipped with a message).

The time-per-batch setting (4 hosts in network namespaces over shaped links) is
perf/train/time_study.py.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(HERE, "train.py")
sys.path.insert(0, HERE)
import runlabel  # noqa: E402
RESULTS = os.path.join(ROOT, "perf", "results", "train")  # --results
IMG = os.path.join(ROOT, "docs", "img")                    # --img
# Seconds per run measured with 16 workers (torch 2.11, 2 cores shared with other work), for the
# plan's estimate only: PyTorch's hook, waited per bucket, is about twice as slow per batch.
EST_S = {"cnn": 42, "transformer": 60}
EST_TORCH_POWERSGD_S = {"cnn": 60, "transformer": 115}


def estimate(c):
    return (EST_TORCH_POWERSGD_S if c[1] == "torch-powersgd" else EST_S)[c[0]]
# Student's t, two-sided 95%, by degrees of freedom (for the intervals over seeds).
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def configs(ranks):
    """(reducer, rank or None) in the order run within a seed."""
    out = [("allreduce", None), ("lowrank-exact", None), ("fp16", None)]
    for k in ranks:
        out += [("torch-powersgd", k), ("lowrank", k)]
    return out


def name(model, reducer, k, seed):
    return f"{model}_{reducer}" + (f"_r{k}" if k else "") + f"_s{seed}"


def plan(args):
    seeds = {"cnn": args.cnn_seeds, "transformer": args.transformer_seeds}
    out = []
    for seed in range(max(seeds[m] for m in args.models)):
        for model in args.models:
            if seed < seeds[model]:
                out += [(model, r, k, seed) for r, k in configs(args.ranks)]
    return out


def run_all(args):
    todo = plan(args)
    outdir = os.path.join(RESULTS, "accuracy")
    os.makedirs(outdir, exist_ok=True)
    left = [c for c in todo if not os.path.exists(os.path.join(outdir, name(*c) + ".json"))]
    est = sum(estimate(c) for c in left)
    print(f"{len(todo)} runs in the plan, {len(todo) - len(left)} done, {len(left)} to run "
          f"(~{est / 60:.0f} min at the measured pace)", flush=True)
    if args.dry_run:
        for c in left:
            print("  " + name(*c))
        return
    t_start = time.monotonic()
    failed = []
    for i, (model, reducer, k, seed) in enumerate(left):
        if args.budget_min and time.monotonic() - t_start > 60 * args.budget_min:
            print(f"budget of {args.budget_min} min spent: {len(left) - i} runs left for a later call")
            break
        n = name(model, reducer, k, seed)
        out = os.path.join(outdir, n + ".json")
        cmd = [args.python, DRIVER, "--spawn", str(args.workers), "--model", model,
               "--reducer", reducer, "--seed", str(seed), "--start-iter", str(args.start_iter),
               "--out", out]
        if k:
            cmd += ["--rank", str(k)]
        cmd += args.driver_args.split()
        t0 = time.monotonic()
        with open(os.path.join(outdir, n + ".log"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = p.wait(timeout=args.run_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)  # the driver and the workers it forked: their own session
                p.wait()
                rc = "timeout"
        ok = rc == 0 and os.path.exists(out)
        if not ok:
            failed.append(n)
        print(f"[{i + 1}/{len(left)}] {n}: {'ok' if ok else f'FAILED ({rc})'}, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
    if failed:
        print("failed (see their .log): " + ", ".join(failed))


# ---- summary -------------------------------------------------------------------------------------
def mean_se(xs):
    n = len(xs)
    if n == 0:
        return None, None, 0
    m = sum(xs) / n
    if n < 2:
        return m, None, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n), n


def load_runs():
    runs = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "accuracy", "*.json"))):
        with open(path) as f:
            d = json.load(f)
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
        m, se, n = mean_se([final_metric(d) for d in ds])
        t, tse, _ = mean_se([steady_ms(d) for d in ds])
        b, _, _ = mean_se([d["epochs"][-1]["bits_cumulative"] for d in ds])
        h = [e["hook_call_ms_mean"] for d in ds for e in d["epochs"][1:]
             if e.get("hook_call_ms_mean") is not None]
        rows.append(dict(model=model, reducer=reducer, rank=k, seeds=sorted(d["config"]["seed"] for d in ds),
                         n=n, metric="test_accuracy" if model == "cnn" else "test_loss",
                         mean=m, se=se, batch_ms=t, batch_ms_se=tse, bits_per_worker=b,
                         hook_call_ms=sum(h) / len(h) if h else None,
                         workers=ds[0]["config"]["world"], epochs=ds[0]["config"]["epochs"],
                         torch=ds[0]["machine"]["torch"]))
    targets = []

    def row(model, reducer, k=None):
        return next((r for r in rows if (r["model"], r["reducer"], r["rank"]) == (model, reducer, k)), None)

    def se_diff(a, b):
        if a["se"] is None or b["se"] is None:
            return None
        return math.sqrt(a["se"] ** 2 + b["se"] ** 2)

    for model in ("cnn", "transformer"):
        full = row(model, "allreduce")
        for k in ranks:
            # PyTorch's hook's accuracy: chained or waited, the same arithmetic (bit for bit in
            # tests/train/test_torch_baseline.py), so the waited runs stand in for it.
            low = row(model, "lowrank", k)
            tor = row(model, "torch-powersgd", k) or row(model, "torch-powersgd-waited", k)
            if full and low and k in (2, 4):
                d = low["mean"] - full["mean"]
                if model == "cnn":
                    s = se_diff(low, full)
                    tol = max(0.005, 2 * s) if s is not None else 0.005
                    met = abs(d) <= tol
                    text = (f"CNN, lowrank rank {k} within max(0.5 points, 2 SE) of full precision: "
                            f"{100 * low['mean']:.2f}% vs {100 * full['mean']:.2f}%, difference "
                            f"{100 * d:+.2f} points, tolerance {100 * tol:.2f}")
                else:
                    met = d <= 0.02 * full["mean"]
                    text = (f"transformer, lowrank rank {k} within 2% of full precision's test loss: "
                            f"{low['mean']:.4f} vs {full['mean']:.4f} ({100 * d / full['mean']:+.2f}%)")
                targets.append(dict(model=model, rank=k, target="vs full precision", met=met, text=text,
                                    n=(low["n"], full["n"])))
            if low and tor:
                s = se_diff(low, tor)
                worse = (tor["mean"] - low["mean"]) if model == "cnn" else (low["mean"] - tor["mean"])
                met = worse <= (2 * s if s is not None else 0.0)
                unit = "points" if model == "cnn" else "nats"
                scale = 100 if model == "cnn" else 1
                text = (f"{model}, rank {k}: lowrank {scale * low['mean']:.4g} vs PyTorch's hook "
                        f"{scale * tor['mean']:.4g}; lowrank worse by {scale * worse:+.3g} {unit}, "
                        f"2 SE = {scale * 2 * s:.3g}" if s is not None else
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


def write_summary(rows, targets):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "accuracy_summary.json"), "w") as f:
        json.dump(dict(rows=rows, targets=targets), f, indent=1)
    lines = ["# Accuracy study: summary", "",
             "Written by perf/train/study.py from perf/results/train/accuracy/*.json. Final metric: "
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
    lines += [f"- {'MET' if t['met'] else 'NOT MET'}: {t['text']} (seeds {t['n'][0]} and {t['n'][1]})"
              for t in targets] or ["- no results yet"]
    with open(os.path.join(RESULTS, "accuracy_summary.md"), "w") as f:
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
              "/usr/bin/python3 perf/train/study.py --report-only)")
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


def main():
    global RESULTS, IMG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable,
                    help="the Python with torch that runs the driver (default: this one; the study "
                         "used /opt/venv-t2/bin/python, torch 2.11 with MKL)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--models", nargs="+", choices=["cnn", "transformer"], default=["cnn", "transformer"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--cnn-seeds", type=int, default=5)
    ap.add_argument("--transformer-seeds", type=int, default=3)
    ap.add_argument("--start-iter", type=int, default=10, help="start_powerSGD_iter of both hooks")
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds before a run is killed")
    ap.add_argument("--budget-min", type=float, help="launch no new run after this many minutes")
    ap.add_argument("--driver-args", default="", help="more arguments for every run of the driver "
                                                      "(a trial: \"--epochs 1 --batch 64\")")
    ap.add_argument("--results", default=RESULTS, help="folder of the runs and the summary")
    ap.add_argument("--img", default=IMG, help="folder of the figures")
    ap.add_argument("--dry-run", action="store_true", help="print the runs left, run nothing")
    ap.add_argument("--report-only", action="store_true", help="summary and figures only")
    args = ap.parse_args()
    RESULTS, IMG = os.path.abspath(args.results), os.path.abspath(args.img)
    if not args.report_only:
        run_all(args)
        if args.dry_run:
            return
    rows, targets = summarize(args.ranks)
    write_summary(rows, targets)
    plot(args.ranks)


if __name__ == "__main__":
    main()
