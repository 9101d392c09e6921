#!/usr/bin/env python3
"""The report of the time-to-accuracy runs (studies/tta/run.py; issue 42 item 2): per
configuration the final test accuracy, the time to accuracy, the training time of the whole
schedule (the sum of every epoch's `train_s` on rank 0: the steps, not the evaluations) and the
run's wall time; the target's verdicts; the figure of test accuracy against training time.

The rules (plan.toml's [rules], fixed before the runs, where they are spelled out):
- threshold: full precision's final test accuracy, the mean over its seeds, minus 0.5 points;
- a run's time to accuracy: its cumulative training time, every evaluation left out, at its first
  evaluation point (every quarter epoch) whose test accuracy reaches the threshold; a run that
  never reaches it fails;
- target, per lowrank rank: every planned seed reaches the threshold, and the time-to-accuracy
  ratio lowrank / full precision (geometric mean over seeds, paired by seed; its t-interval at the
  plan's confidence, studies/lib/stats.py's paired_ratio) has its upper end <= 1/4: MET; NOT MET
  when a lowrank seed fails or the lower end > 1/4; UNDECIDED otherwise. A full-precision seed
  that fails enters with its whole training time (a lower bound): then only MET is decided.
Reported beside it, not the target: the final accuracy minus full precision's (paired) and time to
accuracy against PyTorch's hook at the same rank. Comparisons are paired by seed (the seed fixes
the data order and the initial weights, shared by every reducer's run of it). Runs from a tree
with uncommitted changes, or evaluated other than the plan's times per epoch, are left out and
listed (--allow-dirty keeps the former, for trying).

  /usr/bin/python3 -m studies.tta.report studies/tta/results/wire_100mbit \
      --md studies/tta/results/wire_100mbit/summary.md \
      --json studies/tta/results/wire_100mbit/summary.json \
      --figure docs/img/tta_cnn_wire_100mbit.png
"""
import argparse
import dataclasses
import glob
import json
import math
import os
import statistics as st
import sys

from studies.lib import plan as planfile
from studies.lib import provenance, runlabel
from studies.lib.runs import read_json
from studies.lib import stats
from studies.lib.provenance import revision

PLAN = planfile.load(__file__)
RULES = PLAN["rules"]
EVALS_PER_EPOCH = PLAN["evals_per_epoch"]
THRESHOLD_POINTS = RULES["threshold_points"]  # below full precision's final accuracy
SLACK = 1e-9                          # floating point's, in the accuracy >= threshold comparison
ACC_POINTS = RULES["acc_points"]      # the reported final-accuracy comparison's tolerance
SE_MULTIPLE = RULES["se_multiple"]
TIME_TARGET = RULES["time_target"]    # time to accuracy at most a quarter of full precision's
FULL, TORCH = RULES["full"], RULES["torch"]
TARGET_RANKS = tuple(RULES["target_ranks"])
CONFIDENCE = RULES["confidence"]  # of every interval over seeds
SEEDS = list(range(PLAN["seeds"]))


def label(reducer, k):
    return reducer + (f" k={k}" if k else "")


def load(folder, allow_dirty=False):
    """({(reducer, k): {seed: run}}, [left-out file and why]). A run: dict(acc (final test
    accuracy), train_s (the schedule's), wall_s, curve=[(cumulative train s, test accuracy)] per
    evaluation point (train.py's `evals`), git, library (provenance.library_sha256))."""
    runs, left = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)
        d, why = read_json(path)
        if why:
            left.append((name, why))
            continue
        if not isinstance(d, dict) or ("epochs" not in d and "config" not in d):
            continue  # the summary, not a run
        provenance.check_run(d, PLAN, path)
        try:
            git = (d.get("machine") or {}).get("git") or ""
            if (not git or git.endswith("-dirty")) and not allow_dirty:
                left.append((name, f"uncommitted changes or no revision ({git!r})"))
                continue
            c = d["config"]
            per_epoch = c.get("evals_per_epoch", 1)  # runs before the option: once per epoch
            if per_epoch != EVALS_PER_EPOCH:
                left.append((name, f"evaluated {per_epoch} times per epoch, the plan's is "
                                   f"{EVALS_PER_EPOCH}"))
                continue
            reducer = runlabel.reducer(c)
            k = c["rank"] if runlabel.has_rank(reducer) else 0
            curve = [(e["train_s"], e["test_accuracy"]) for e in d["evals"]]
            run = dict(acc=curve[-1][1], train_s=sum(e["train_s"] for e in d["epochs"]),
                       wall_s=d["wall_s"], curve=curve, git=git,
                       library=provenance.library_sha256(d))
        except (KeyError, IndexError, TypeError) as e:
            left.append((name, f"not a complete train.py run of the CNN (missing {e})"))
            continue
        runs.setdefault((reducer, k), {})[c["seed"]] = run
    return runs, left


def threshold(runs):
    """Full precision's final test accuracy, the mean over its seeds, minus threshold_points;
    None without a full-precision run."""
    full = runs.get((FULL, 0), {})
    if not full:
        return None
    return st.mean(r["acc"] for r in full.values()) - THRESHOLD_POINTS


def time_to_accuracy(curve, level):
    """The cumulative training time at the first (time, accuracy) point of `curve` whose accuracy
    >= level (SLACK below it counts), or None when none does (the run fails)."""
    return next((t for t, acc in curve if acc >= level - SLACK), None)


def mean_se(xs):
    """(mean, standard error, n) over seeds; the SE NaN for one seed (stats.mean_se needs 2), all
    NaN for none."""
    if not xs:
        return math.nan, math.nan, 0
    if len(xs) < 2:
        return st.mean(xs), math.nan, len(xs)
    m = stats.mean_se(xs)
    return m.mean, m.se, m.n


def paired(a, b, key):
    """Per-seed values of `key` of runs a and b over the seeds both have: ([a], [b], seeds)."""
    seeds = sorted(set(a) & set(b))
    return [a[s][key] for s in seeds], [b[s][key] for s in seeds], seeds


def verdict_ratio(ci, target, strict=False):
    """MET / NOT MET / UNDECIDED for a ratio's stats.Interval against `target`."""
    lo, hi = ci.low, ci.high
    if any(math.isnan(x) for x in (lo, hi)):
        return "UNDECIDED"
    if hi < target or (hi <= target and not strict):
        return "MET"
    return "NOT MET" if (lo >= target if strict else lo > target) else "UNDECIDED"


def with_tta(runs):
    """(threshold, runs) with each run's `tta` set: its time to accuracy, None when it fails (and
    every tta None without a threshold)."""
    level = threshold(runs)
    for v in runs.values():
        for r in v.values():
            r["tta"] = None if level is None else time_to_accuracy(r["curve"], level)
    return level, runs


def targets(runs):
    """{k: dict(...)} for every lowrank rank run (runs as with_tta's): the target's check
    (time_vs_full), the reported ones (accuracy, time_vs_torch) and the verdict."""
    level, runs = with_tta(runs)
    out = {}
    full, ranks = runs.get((FULL, 0), {}), sorted(k for r, k in runs if r == "lowrank")
    for k in ranks:
        lr = runs[("lowrank", k)]
        t = dict(rank=k, threshold=level, missing=[],
                 failing=[] if level is None else sorted(s for s, r in lr.items()
                                                         if r["tta"] is None),
                 absent=[s for s in SEEDS if s not in lr])
        if t["absent"]:
            t["missing"].append(f"lowrank k={k}: no run of seed(s) {t['absent']}")
        seeds = sorted(s for s in set(lr) & set(full) if lr[s]["tta"] is not None)
        if level is None:
            t["missing"].append(f"no {FULL} run: no threshold")
        elif len(seeds) >= 2:
            censored = [s for s in seeds if full[s]["tta"] is None]  # its whole time: a lower bound
            a = [lr[s]["tta"] for s in seeds]
            b = [full[s]["tta"] if full[s]["tta"] is not None else full[s]["train_s"] for s in seeds]
            ci = stats.paired_ratio(a, b, CONFIDENCE)
            v = verdict_ratio(ci, TIME_TARGET)
            if v == "NOT MET" and censored:
                v = "UNDECIDED"
            t["time_vs_full"] = dict(seeds=seeds, ratio=ci, target=TIME_TARGET, verdict=v,
                                     full_censored=censored)
        else:
            t["missing"].append(f"time to accuracy against {FULL}: {len(seeds)} seed(s) paired "
                                "with both runs present and lowrank's reaching, 2 needed")
        a, b, seeds = paired(lr, full, "acc")
        if len(seeds) >= 2:
            d = stats.paired_difference(a, b, CONFIDENCE)
            tol = max(ACC_POINTS, SE_MULTIPLE * d.se)
            t["accuracy"] = dict(seeds=seeds, diff=d.estimate, se=d.se, tolerance=tol,
                                 interval=(d.low, d.high), confidence=CONFIDENCE,
                                 within=d.estimate >= -tol)
        tor = runs.get((TORCH, k), {})
        seeds = sorted(s for s in set(lr) & set(tor)
                       if lr[s]["tta"] is not None and tor[s]["tta"] is not None)
        if len(seeds) >= 2:
            t["time_vs_torch"] = dict(seeds=seeds, ratio=stats.paired_ratio(
                [lr[s]["tta"] for s in seeds], [tor[s]["tta"] for s in seeds], CONFIDENCE))
        ratio = t.get("time_vs_full", {}).get("verdict", "UNDECIDED")
        if t["failing"]:
            t["verdict"] = "NOT MET"  # a lowrank seed that never reaches the threshold
        elif t["absent"] and ratio == "MET":
            t["verdict"] = "UNDECIDED"  # every planned seed must be seen reaching it
        else:
            t["verdict"] = ratio
        out[k] = t
    return out


def report(folder, allow_dirty=False):
    """(markdown lines, summary dict)."""
    runs, left = load(folder, allow_dirty)
    level, runs = with_tta(runs)
    revs = sorted({r["git"] for v in runs.values() for r in v.values()})
    lines = [f"Report at revision {revision()} (studies/tta/report.py) of {folder}: runs from "
             f"{', '.join(revs) or 'none'}.", ""]
    for f, why in left:
        lines.append(f"- left out: {f}: {why}")
    lines += [""] if left else []
    lines.append(f"Threshold: {FULL}'s final test accuracy, the mean over its seeds, minus "
                 f"{THRESHOLD_POINTS:g}: " + (f"{level:.4f}." if level is not None else
                                              f"none (no {FULL} run)."))
    lines += ["", "| configuration | seeds | final test accuracy | reached the threshold | "
              "time to accuracy (s) | training time (s) | run wall time (s) |",
              "|---|---|---|---|---|---|---|"]
    rows = {}
    order = [(FULL, 0), ("fp16", 0)] + sorted(k for k in runs if k[0] not in (FULL, "fp16"))
    for key in [k for k in order if k in runs]:
        v = runs[key]
        acc, tr, wall = (mean_se([r[x] for r in v.values()]) for x in ("acc", "train_s", "wall_s"))
        reached = sorted(s for s, r in v.items() if r["tta"] is not None)
        tta = mean_se([v[s]["tta"] for s in reached])
        failing = sorted(set(v) - set(reached))
        rows[label(*key)] = dict(seeds=sorted(v), acc=acc[:2], train_s=tr[:2], wall_s=wall[:2],
                                 tta=tta[:2], tta_per_seed={s: r["tta"] for s, r in v.items()},
                                 failing=failing)
        lines.append(f"| {label(*key)} | {acc[2]} | {acc[0]:.4f} ± {acc[1]:.4f} | "
                     f"{len(reached)} of {len(v)}" + (f" (failing: seed {failing})" if failing else "")
                     + f" | {tta[0]:.1f} ± {tta[1]:.1f} | {tr[0]:.1f} ± {tr[1]:.1f} | "
                     f"{wall[0]:.1f} ± {wall[1]:.1f} |")
    lines += ["", f"Means ± SE over seeds (time to accuracy: over the seeds that reach the "
              f"threshold). Times: rank 0's steps, every evaluation left out (the test set is "
              f"evaluated {EVALS_PER_EPOCH} times per epoch); training time: the whole schedule.", ""]
    tg = targets(runs)
    for k, t in tg.items():
        lines.append(f"**lowrank at rank {k}: {t['verdict']}**")
        if t["failing"]:
            lines.append(f"- seed(s) {t['failing']} never reach the threshold: failing")
        if "time_vs_full" in t:
            c = t["time_vs_full"]
            r = c["ratio"]
            lines.append(f"- time to accuracy / {FULL}'s: {r.estimate:.3f} [{r.low:.3f}, {r.high:.3f}] "
                         f"(target <= {c['target']:.3g}, seeds {c['seeds']}): {c['verdict']}"
                         + (f"; {FULL}'s seed(s) {c['full_censored']} never reach it and enter "
                            "with their whole training time" if c["full_censored"] else ""))
        lines += [f"- not decided: {m}" for m in t["missing"]]
        if "accuracy" in t:
            a = t["accuracy"]
            lo, hi = a["interval"]
            lines.append(f"- reported: final accuracy minus {FULL}'s, paired over seeds {a['seeds']}: "
                         f"{a['diff']:+.4f} (SE {a['se']:.4f}; {'within' if a['within'] else 'beyond'} "
                         f"-{a['tolerance']:.4f}); its {a['confidence']:.0%} t-interval "
                         f"[{lo:+.4f}, {hi:+.4f}]")
        if "time_vs_torch" in t:
            c = t["time_vs_torch"]
            r = c["ratio"]
            lines.append(f"- reported: time to accuracy / {TORCH}'s at rank {k}: {r.estimate:.3f} "
                         f"[{r.low:.3f}, {r.high:.3f}] (seeds {c['seeds']})")
        lines.append("")
    verdicts = {k: tg[k]["verdict"] if k in tg else "UNDECIDED (no runs)" for k in TARGET_RANKS}
    met = all(v == "MET" for v in verdicts.values())
    lines.append(f"Target (time to accuracy <= {TIME_TARGET:g} of {FULL}'s, every lowrank seed "
                 f"reaching the threshold, at every rank of {list(TARGET_RANKS)}): "
                 + ("MET" if met else "not met") + " ("
                 + "; ".join(f"rank {k}: {v}" for k, v in verdicts.items()) + ").")
    libs = sorted({r["library"] for v in runs.values() for r in v.values()})
    return lines, dict(revision=revision(), runs_from=revs, libraries=libs, left_out=left, threshold=level,
                       evals_per_epoch=EVALS_PER_EPOCH, rows=rows, targets=tg,
                       target=dict(met=met, verdicts=verdicts))


def figure(folder, path, allow_dirty=False):
    """Writes the figure to `path`; False (nothing written) when matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs, _ = load(folder, allow_dirty)
    level = threshold(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key in sorted(runs):
        v = list(runs[key].values())
        n = min(len(r["curve"]) for r in v)
        xs = [st.mean(r["curve"][i][0] for r in v) for i in range(n)]
        ys = [st.mean(r["curve"][i][1] for r in v) for i in range(n)]
        ax.plot(xs, ys, marker="o", ms=2, label=f"{label(*key)} ({len(v)} seeds)")
    if level is not None:
        ax.axhline(level, color="k", lw=0.8, ls="--", label=f"threshold {level:.4f}")
    ax.set_xscale("log")
    ax.set_xlabel("training time, s (rank 0's steps, mean over seeds; log scale)")
    ax.set_ylabel("test accuracy (mean over seeds)")
    ax.set_title(f"CNN, 4 hosts, {os.path.basename(os.path.normpath(folder))}: accuracy every "
                 f"1/{EVALS_PER_EPOCH} epoch")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.text(0.01, 0.01, f"studies/tta/report.py at {revision()}", fontsize=6, alpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--md")
    ap.add_argument("--json")
    ap.add_argument("--figure")
    ap.add_argument("--allow-dirty", action="store_true", help="for trying, never for results")
    args = ap.parse_args()
    if not os.path.isdir(args.folder):
        raise SystemExit(f"studies.tta.report: no folder {args.folder}")
    lines, summary = report(args.folder, args.allow_dirty)
    if not summary["rows"]:  # never overwrite a summary with an empty one
        sys.stderr.write("\n".join(lines) + "\n")
        subs = sorted(d for d in os.listdir(args.folder) if os.path.isdir(os.path.join(args.folder, d)))
        raise SystemExit(f"studies.tta.report: no usable run in {args.folder}"
                         + (f" (its folders, one per rate: {', '.join(subs)})" if subs else ""))
    for path in (args.md, args.json, args.figure):
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.md:
        open(args.md, "w").write(text)
    if args.json:
        json.dump(summary, open(args.json, "w"), indent=1, default=dataclasses.asdict)
    if args.figure and not figure(args.folder, args.figure, args.allow_dirty):
        sys.stderr.write("no matplotlib: figures skipped\n")  # as the accuracy and rank reports
    return 0


if __name__ == "__main__":
    sys.exit(main())
