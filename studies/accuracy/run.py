#!/usr/bin/env python3
"""The accuracy study of docs/training.md: the training driver (studies/train/train.py) over every
reducer but `local`, PowerSGD at ranks 1, 2 and 4 for both implementations, several seeds, 16
workers on this host (the plan: plan.toml beside this file); then report.py's summary (final metric
per configuration, the targets of issue 12) and figures.

Resumable: a configuration whose JSON exists is not rerun (the driver writes it whole, at the end).
Runs are ordered seed by seed, so a stopped study leaves every configuration with about as many
seeds as the others.

  # the runs (~70 min: CNN 42-60 s a run, transformer 60-115 s, on this 2-core machine), then
  # the summary and figures
  /usr/bin/python3 -m studies.accuracy.run --python /opt/venv-t2/bin/python
  # only the summary and the figures from the JSON present
  /usr/bin/python3 -m studies.accuracy.report
  # the plan, nothing run
  /usr/bin/python3 -m studies.accuracy.run --dry-run
  # issue 44's plan (plan_alternate.toml): PowerSGD k=2 and alternating PowerSGD at k=2 and 4,
  # its seeds and results folder; then report_alternate.py's verdicts. Needs a committed tree and
  # LOWRANK_LIBRARY (every arm the same recorded build); a crashed run is rerun once (the plan's rule)
  LOWRANK_LIBRARY=/path/liblowrank.so /usr/bin/python3 -m studies.accuracy.run --plan alternate \
      --python /work/venv-torch2/bin/python

Writes studies/accuracy/results/runs/<model>_<reducer>[_r<k>]_s<seed>.json (and .log); the report
writes studies/accuracy/results/summary.{json,md} and docs/img/train_*.png. With --plan alternate:
<plan's results>/runs/<model>_<label>_r<k>_s<seed>.json (cnn_lowrank-alternate_r2_s0.json: the
label lowrank-alternate runs the driver with --reducer lowrank --alternate) and the summary there.

The time-per-batch setting (4 hosts in network namespaces over shaped links) is studies/time.
"""
import argparse
import os
import subprocess
import sys
import time

from studies.accuracy import report
from studies.lib import launch, provenance, runlabel
from studies.lib import plan as planfile

PLAN = planfile.load(__file__)
PLANS = {"accuracy": "plan.toml", "alternate": "plan_alternate.toml", "bf16": "plan_bf16.toml"}  # --plan
DRIVER = "studies.train.train"
RESULTS = report.RESULTS  # --results
IMG = report.IMG          # --img


def estimate(c):
    """Seconds a run (model, reducer, ...) takes, for the plan's estimate only."""
    table = PLAN["estimate_torch_powersgd_s"] if c[1] == "torch-powersgd" else PLAN["estimate_s"]
    return table[c[0]]


def configs(ranks, arms=None):
    """(reducer, rank or None) in the order run within a seed: `arms`, a plan's [label, k] list
    (plan_alternate.toml), when given; else the accuracy study's reducers at `ranks`."""
    if arms is not None:
        return [(label, k) for label, k in arms]
    out = [("allreduce", None), ("lowrank-exact", None), ("fp16", None)]
    for k in ranks:
        out += [("torch-powersgd", k), ("lowrank", k)]
    return out


def reducer_args(reducer):
    """The driver's arguments for a reducer label (runlabel.reducer's): lowrank-alternate is
    --reducer lowrank --alternate, lowrank-bf16 --reducer lowrank --factor-dtype bf16 (both:
    lowrank-alternate-bf16)."""
    if reducer == "lowrank-exact" or not reducer.startswith("lowrank"):
        return ["--reducer", reducer]
    out = ["--reducer", "lowrank"]
    for part in reducer.split("-")[1:]:
        if part == "alternate":
            out.append("--alternate")
        elif part in ("bf16", "fp16"):
            out += ["--factor-dtype", part]
    # only the labels runlabel gives such runs back (lowrank[-alternate][-bf16|-fp16]): a plan's
    # arm must name its runs
    config = {"reducer": "lowrank", "alternate": "--alternate" in out,
              "factor_dtype": out[out.index("--factor-dtype") + 1] if "--factor-dtype" in out else "fp32"}
    if runlabel.reducer(config) != reducer:
        raise SystemExit(f"studies.accuracy.run: reducer label {reducer!r} is not one the driver's "
                         "runs carry (lowrank, lowrank-alternate, lowrank-bf16, lowrank-fp16, "
                         "lowrank-alternate-bf16, lowrank-alternate-fp16, or another reducer's name)")
    return out


def name(model, reducer, k, seed):
    return f"{model}_{reducer}" + (f"_r{k}" if k else "") + f"_s{seed}"


def plan(args):
    seeds = {"cnn": args.cnn_seeds, "transformer": args.transformer_seeds}
    out = []
    for seed in range(max(seeds[m] for m in args.models)):
        for model in args.models:
            if seed < seeds[model]:
                out += [(model, r, k, seed) for r, k in configs(args.ranks, args.arms)]
    return out


def run_all(args):
    todo = plan(args)
    outdir = os.path.join(RESULTS, "runs")
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
        cmd = launch.module(args.python, DRIVER, "--spawn", str(args.workers), "--model", model,
               *reducer_args(reducer), "--seed", str(seed), "--start-iter", str(args.start_iter),
               "--out", out)
        if k:
            cmd += ["--rank", str(k)]
        cmd += args.driver_args.split()
        for attempt in range(1 + args.retries):
            if attempt:  # the failed attempt's log is kept beside
                os.replace(os.path.join(outdir, n + ".log"),
                           os.path.join(outdir, f"{n}.failed{attempt}.log"))
            t0 = time.monotonic()
            with open(os.path.join(outdir, n + ".log"), "w") as log:
                log.write(" ".join(cmd) + "\n")
                log.flush()
                p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=launch.env())
                try:
                    rc = p.wait(timeout=args.run_timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)  # the driver and the workers it forked: their own session
                    p.wait()
                    rc = "timeout"
            ok = rc == 0 and os.path.exists(out)
            print(f"[{i + 1}/{len(left)}] {n}" + (f" (rerun {attempt})" if attempt else "")
                  + f": {'ok' if ok else f'FAILED ({rc})'}, {time.monotonic() - t0:.0f} s", flush=True)
            if ok:
                break
        if not ok:
            failed.append(n)
    if failed:
        print("failed (see their .log): " + ", ".join(failed))


def main():
    global RESULTS, PLAN
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plan", choices=sorted(PLANS), default="accuracy")
    which = pre.parse_known_args()[0].plan
    if which != "accuracy":
        PLAN = planfile.load(__file__, PLANS[which])
    results = os.path.join(launch.ROOT, PLAN["results"]) if "results" in PLAN else RESULTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", choices=sorted(PLANS), default="accuracy",
                    help="the plan file: accuracy (plan.toml, issue 12's study), alternate "
                         "(plan_alternate.toml, issue 44) or bf16 (plan_bf16.toml, issue 45): the "
                         "last two give their arms, seeds, results folder, and report_alternate.py's "
                         "verdicts")
    ap.add_argument("--python", default=sys.executable,
                    help="the Python with torch that runs the driver (default: this one; the study "
                         "used /opt/venv-t2/bin/python, torch 2.11 with MKL)")
    ap.add_argument("--workers", type=int, default=PLAN["workers"])
    ap.add_argument("--models", nargs="+", choices=["cnn", "transformer"], default=PLAN["models"])
    ap.add_argument("--ranks", nargs="+", type=int, default=PLAN.get("ranks"),
                    help="PowerSGD's ranks (--plan accuracy; the alternate plan's arms carry theirs)")
    ap.add_argument("--cnn-seeds", type=int, default=PLAN["seeds"]["cnn"])
    ap.add_argument("--transformer-seeds", type=int, default=PLAN["seeds"]["transformer"])
    ap.add_argument("--start-iter", type=int, default=PLAN["start_iter"],
                    help="start_powerSGD_iter of both hooks")
    ap.add_argument("--run-timeout", type=float, default=PLAN["run_timeout_s"],
                    help="seconds before a run is killed")
    paired = which != "accuracy"  # a paired-arms plan (report_alternate.py's)
    ap.add_argument("--retries", type=int, default=1 if paired else 0,
                    help="reruns of a run that fails, at once, same seed and build (default: 1 with "
                         "a paired plan, alternate or bf16, their rule's; else 0)")
    ap.add_argument("--budget-min", type=float, help="launch no new run after this many minutes")
    ap.add_argument("--driver-args", default="", help="more arguments for every run of the driver "
                                                      "(a trial: \"--epochs 1 --batch 64\")")
    ap.add_argument("--results", default=results, help="folder of runs/ and the summary")
    ap.add_argument("--img", default=IMG, help="folder of the figures")
    ap.add_argument("--dry-run", action="store_true", help="print the runs left, run nothing")
    args = ap.parse_args()
    args.arms = [list(a) for a in PLAN["arms"]] if paired else None
    RESULTS = os.path.abspath(args.results)
    if paired and not args.dry_run:
        lib = os.environ.get("LOWRANK_LIBRARY")
        if not lib or not os.path.exists(lib):
            sys.exit(f"studies.accuracy.run --plan {which}: set LOWRANK_LIBRARY to the liblowrank "
                     "every arm loads (the plan: one build for all arms; each run records its path "
                     f"and sha256), not {lib!r}")
        provenance.refuse_unless_ready("studies.accuracy.run", launch.ROOT, args.python, need_root=False)
    run_all(args)
    if args.dry_run:
        return
    if paired:
        from studies.accuracy import report_alternate
        report_alternate.use_plan(which)
        report_alternate.report(RESULTS)
    else:
        report.report(RESULTS, args.img, args.ranks)


if __name__ == "__main__":
    main()
