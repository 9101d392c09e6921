#!/usr/bin/env python3
"""The HSDP study (docs/pytorch.md): every model x reducer x seed of plan.toml, one driver run each
(studies/hsdp/driver.py: FSDP2 HSDP, replicas x shards on this host), seed by seed. Resumable: a run
whose JSON exists is not rerun. Then studies/hsdp/report.py makes the table. Needs torch >= 2.7.

  /usr/bin/python3 -m studies.hsdp.run --python /work/venv2/bin/python
  /usr/bin/python3 -m studies.hsdp.run --dry-run

Writes studies/hsdp/results/<model>_<reducer>_s<seed>.json (and .log).
"""
import argparse
import os
import subprocess
import sys

from studies.lib import launch
from studies.lib import plan as planfile

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def plan():
    """(seed, model, reducer) in the order run."""
    return [(s, m, r) for s in range(PLAN["seeds"]) for m in PLAN["models"] for r in PLAN["reducers"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the Python with torch >= 2.7")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    todo = [(s, m, r) for s, m, r in plan()
            if not os.path.exists(os.path.join(args.results, f"{m}_{r}_s{s}.json"))]
    print(f"# studies.hsdp.run: {len(plan())} runs in the plan, {len(todo)} to do", flush=True)
    failed = 0
    for seed, model, reducer in todo:
        out = os.path.join(args.results, f"{model}_{reducer}_s{seed}.json")
        cmd = launch.module(args.python, "studies.hsdp.driver", "--spawn", str(PLAN["workers"]),
                            "--model", model, "--reducer", reducer, "--seed", str(seed), "--out", out)
        if args.dry_run:
            print("  " + " ".join(cmd))
            continue
        os.makedirs(args.results, exist_ok=True)
        with open(out[:-5] + ".log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=launch.env()).returncode
        failed += rc != 0
        print(f"{model} {reducer} seed {seed}: {'ok' if rc == 0 else f'FAILED ({rc})'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
