#!/usr/bin/env python3
"""The table of the HSDP runs (studies/hsdp/run.py): per model and reducer of plan.toml, the final
metric (cnn: test accuracy; transformer: test loss) as mean +- standard error over seeds, and the
bits per worker of the whole run (mean). Prints Markdown (results/summary.md holds it with its
preamble).

  /usr/bin/python3 -m studies.hsdp.report [FOLDER]     (default studies/hsdp/results)
"""
import argparse
import glob
import json
import os
import statistics
import sys

from studies.lib import plan as planfile
from studies.lib import provenance
from studies.lib import stats

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run_files(folder):
    """The run files in `folder` (each run's JSON; summary.json, the report's own, is no run)."""
    return [p for p in sorted(glob.glob(os.path.join(folder, "*.json")))
            if os.path.basename(p) != "summary.json"]


def summary(folder):
    """The table's lines, for the plan's models and reducers that have runs in `folder`."""
    runs = {}
    for path in run_files(folder):
        with open(path) as f:
            d = json.load(f)
        provenance.check_run(d, PLAN, path)
        c = d["config"]
        if c["model"] in PLAN["models"] and c["reducer"] in PLAN["reducers"]:
            runs.setdefault((c["model"], c["reducer"]), []).append(d)
    lines = ["| model | reducer | seeds | final metric (mean +- SE) | bits per worker (mean) |",
             "|---|---|---|---|---|"]
    for (model, reducer), ds in sorted(runs.items()):
        key = "test_accuracy" if model == "cnn" else "test_loss"
        xs = [d["epochs"][-1][key] for d in ds]
        se = stats.mean_se(xs).se if len(xs) > 1 else float("nan")  # one seed: no SE
        bits = statistics.mean(d["epochs"][-1]["bits_per_worker"] for d in ds)
        lines.append(f"| {model} | {reducer} | {len(xs)} | {key} {statistics.mean(xs):.4f} +- {se:.4f} "
                     f"| {bits:.3g} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", default=RESULTS)
    args = ap.parse_args()
    if not os.path.isdir(args.folder):
        sys.exit(f"studies.hsdp.report: no folder {args.folder}")
    if not run_files(args.folder):
        sys.exit(f"studies.hsdp.report: no runs (*.json) in {args.folder}")
    print("\n".join(summary(args.folder)))


if __name__ == "__main__":
    main()
