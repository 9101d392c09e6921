#!/usr/bin/env python3
"""Time to accuracy (issue 42 item 2; first run for issue 27 item 5): the CNN trained to the end
of its schedule (train.py's defaults: 10 epochs, per-worker batch 8, SGD with momentum, warm-up
then cosine) on 4 hosts, one worker per network namespace of studies/lib/netns_hosts.sh on links
at the plan's rate and one-way delay (100 Mbit/s, 0.25 ms; calibrated first), by full precision
(DDP's allreduce), fp16, PyTorch's PowerSGD hook chained bucket after bucket (the fair baseline,
studies/train/torch_baseline.py) and lowrank's hook, both PowerSGD hooks at ranks 2 and 4; 3 seeds
each. The test set is evaluated after every quarter epoch (plan.toml's evals_per_epoch); each run's
JSON holds every evaluation point's cumulative training time (`evals[].train_s`: the steps alone,
every evaluation left out) and test accuracy: studies/tta/report.py turns them into the times to
accuracy, the table, the verdicts and the figure of accuracy against training time.

Order: seed by seed, every configuration once per seed, the order reversed on odd seeds (no
configuration always follows the same one). Guards, as the switch study's: a tree with uncommitted
changes runs nothing; a run starts only when at most --max-busy of the machine's CPU time was busy
over the last 5 s (nothing else running). Resumable: a run whose JSON exists is not rerun; stops
before a run that would start past --budget-min.

  sudo /usr/bin/python3 -m studies.tta.run --python /work/venv2/bin/python
  /usr/bin/python3 -m studies.tta.run --dry-run                # the plan, nothing run

Writes studies/tta/results/wire_<rate>/cnn_<reducer>[_r<k>]_s<seed>.json (and .log, rank 0's
output; wire_<rate>_<delay>/ for a --delay other than the plan's), calibrations.jsonl beside them.
Needs root (namespaces, tc, nice -20). The plan: plan.toml beside this file. (results/100mbit/:
issue 27's runs, on links that neither delayed nor paced small messages; history.)
"""
import argparse
import os
import re
import sys
import time

from studies.lib import plan as planfile
from studies.lib import provenance
from studies.lib.hosts import Hosts, Servers, add_run_args, may_start
from studies.lib.launch import ROOT

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HOSTS = PLAN["hosts"]
CONFIGS = ",".join(PLAN["configs"])
NAME = "studies.tta.run"


def parse_configs(text):
    """"reducer[:k],..." -> [(reducer, k or 0)]."""
    out = []
    for item in text.split(","):
        reducer, _, k = item.strip().partition(":")
        if reducer not in ("allreduce", "fp16", "torch-powersgd", "lowrank", "lowrank-exact"):
            raise SystemExit(f"{NAME}: unknown reducer {reducer!r} in {item!r}")
        if (reducer in ("torch-powersgd", "lowrank")) != bool(re.fullmatch(r"[0-9]+", k)) \
                or (k and int(k) < 1):
            raise SystemExit(f"{NAME}: {item!r}: the PowerSGD reducers take :RANK, "
                             "the others none")
        c = (reducer, int(k) if k else 0)
        if c in out:
            raise SystemExit(f"{NAME}: {item!r} given twice")
        out.append(c)
    return out


def plan(configs, seeds):
    """(seed, reducer, k) in the order run."""
    out = []
    for s in range(seeds):
        order = configs[::-1] if s % 2 else configs
        out += [(s, r, k) for r, k in order]
    return out


def name(reducer, k, seed):
    return f"cnn_{reducer}" + (f"_r{k}" if k else "") + f"_s{seed}"


def results_dir(results, rate, delay):
    """results/wire_<rate>, with _<delay> appended when the delay is not the plan's."""
    return os.path.join(results, f"wire_{rate}" + ("" if delay == PLAN["delay"] else f"_{delay}"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=CONFIGS, help="reducer[:rank],... (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=PLAN["seeds"])
    ap.add_argument("--rate", default=PLAN["rate"], help="every link's rate (tc's syntax)")
    ap.add_argument("--delay", default=PLAN["delay"],
                    help="every link's one-way delay (tc's syntax: 250us, 1ms)")
    add_run_args(ap, PLAN, RESULTS)
    args = ap.parse_args()
    configs = parse_configs(args.configs)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmg]?bit", args.rate):
        raise SystemExit(f"{NAME}: --rate {args.rate!r}: a rate in bits per second in tc's "
                         "syntax, e.g. 100mbit or 1gbit")
    if not re.fullmatch(r"0|[0-9]+(\.[0-9]+)?(us|ms|s)", args.delay):
        raise SystemExit(f"{NAME}: --delay {args.delay!r}: a one-way delay in tc's syntax, "
                         "e.g. 250us or 1ms")
    if args.seeds < 1:
        raise SystemExit(NAME + ": --seeds must be at least 1")
    if not 0 <= args.max_busy < 1:
        raise SystemExit(NAME + ": --max-busy is a share of the CPU, in [0, 1)")
    outdir = results_dir(args.results, args.rate, args.delay)
    todo = [c for c in plan(configs, args.seeds)
            if not os.path.exists(os.path.join(outdir, name(c[1], c[2], c[0]) + ".json"))]
    print(f"# {NAME}: {HOSTS} hosts at {args.rate} and {args.delay} one way, into {outdir}: "
          f"{len(configs)} configurations x "
          f"{args.seeds} seeds; {len(todo)} to do", flush=True)
    if args.dry_run or not todo:
        for s, r, k in todo:
            print(f"  seed {s} {r}" + (f" k={k}" if k else ""))
        return 0
    provenance.refuse_unless_ready(NAME, ROOT, args.python, need_root=True)
    os.makedirs(outdir, exist_ok=True)
    hosts = Hosts(HOSTS, tag=f"lrt{os.getpid() % 100000}")
    servers, failed, t0 = None, 0, time.monotonic()
    try:
        hosts.make()
        hosts.shape(args.rate)
        hosts.delay(args.delay)  # after the rate, which it keeps; the calibration records both
        hosts.calibrate(outdir)  # refused if the links fail; calibrations.jsonl beside the runs
        servers = Servers(args.python, hosts)  # train.py --serve on each host
        for n, (seed, reducer, k) in enumerate(todo):
            if not may_start(NAME, args, t0):
                return 3
            out = os.path.join(outdir, name(reducer, k, seed) + ".json")
            argv = ["--model", "cnn", "--reducer", reducer, "--rank", str(k or 4), "--seed",
                    str(seed), "--evals-per-epoch", str(PLAN["evals_per_epoch"]),
                    "--timeout", str(args.timeout), "--out", out]
            ts = time.monotonic()
            port = 23000 + (os.getpid() % 200) * 40 + n % 40
            d, note = servers.train(args.rate, argv, out, port)
            if d:
                note = f"test accuracy {d['epochs'][-1]['test_accuracy']:.4f}"
            else:
                failed += 1
            print(f"{time.strftime('%H:%M:%S')} seed {seed} {reducer}" + (f" k={k}" if k else "")
                  + f": {time.monotonic() - ts:.0f} s, {note}", flush=True)
    finally:
        if servers is not None:
            servers.close()
        hosts.down()
    print(f"# {NAME}: done in {(time.monotonic() - t0) / 60:.0f} min, {failed} runs failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
