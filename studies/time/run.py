#!/usr/bin/env python3
"""The time-per-batch setting of the training study (docs/training.md): four workers of
the training driver (studies/train/train.py), one per "host", in network namespaces over links
shaped to each rate (the hosts of studies/lib/netns_hosts.sh, shared with studies/netns/bench.sh;
calibrated at each rate by studies/lib/calibrate.py, which refuses links that fail and writes
calibrations.jsonl beside the runs),
and as plain processes over loopback. Then studies/time/report.py makes the table. The plan
(settings, repetitions, ranks, epochs) is plan.toml beside this file.

Every reducer (allreduce, lowrank-exact, fp16, torch-powersgd and lowrank at each rank, local) is
run interleaved: each repetition runs every configuration once, in turn, the order reversed on odd
repetitions so that no configuration always follows the same one. Within a repetition the settings
come one after another (all of the first setting's configurations, then the next setting's).
Superseded by the switch study (studies/switch) (issue 27): reducers compared inside one run.

Each host runs one `train.py --serve` for the whole study, which forks a worker per run after its
imports (a fresh interpreter with torch 2.x costs ~30 s of the 2 cores). Transports: gloo and
lowrank over TCP on the host's one interface (GLOO_SOCKET_IFNAME, LOWRANK_SOCKET_IFNAME,
UCX_TLS=tcp,self, UCX_NET_DEVICES), so nothing bypasses the links and on loopback both libraries
take the same kind of path. The workers run at nice -20: other work on the machine (run it at
nice 19) takes little of their cores.

Resumable: a configuration whose JSON exists is not rerun; stops before a run that would start
past --budget-min.

  sudo /usr/bin/python3 -m studies.time.run --python /opt/venv-t2/bin/python
  /usr/bin/python3 -m studies.time.run --dry-run       # the plan, nothing run

Writes studies/time/results/<setting>/<model>_<reducer>[_r<k>]_rep<i>.json (and .log, rank 0's
output). Needs root (namespaces, tc, nice -20) unless the only setting is loopback.
"""
import argparse
import os
import sys
import time

from studies.lib import plan as planfile
from studies.lib.hosts import Hosts, Servers

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
N = PLAN["workers"]


def configs(ranks):
    out = [("allreduce", 0), ("lowrank-exact", 0), ("fp16", 0)]
    for k in ranks:
        out += [("torch-powersgd", k), ("lowrank", k)]
    return out + [("local", 0)]


def name(model, reducer, k, rep):
    return f"{model}_{reducer}" + (f"_r{k}" if k else "") + f"_rep{rep}"


def plan(args):
    """(rep, setting, reducer, k) in the order run."""
    out = []
    for rep in range(args.reps):
        order = configs(args.ranks)
        if rep % 2:
            order = order[::-1]
        out += [(rep, s, r, k) for s in args.settings for r, k in order]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default=",".join(PLAN["settings"]),
                    help="link rates (tc's syntax) and/or 'loopback', comma-separated")
    ap.add_argument("--reps", type=int, default=PLAN["reps"], help="repetitions of every configuration")
    ap.add_argument("--ranks", default=",".join(map(str, PLAN["ranks"])),
                    help="approximation ranks of the PowerSGD reducers")
    ap.add_argument("--model", default=PLAN["model"], choices=["cnn", "transformer"])
    ap.add_argument("--epochs", type=int, default=PLAN["epochs"],
                    help="per run; the first is excluded from the time (default 5: 4 x 44 batches "
                         "measured per run with 4 workers, 352 over 2 repetitions)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch for the workers")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--budget-min", type=float, default=PLAN["budget_min"])
    ap.add_argument("--timeout", type=float, default=PLAN["timeout_s"], help="the process group's timeout (s)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    args.settings = args.settings.split(",")
    args.ranks = [int(k) for k in args.ranks.split(",")]

    todo = [c for c in plan(args) if not os.path.exists(
        os.path.join(args.results, c[1], name(args.model, c[2], c[3], c[0]) + ".json"))]
    print(f"# time_study: {time.strftime('%Y-%m-%dT%H:%M:%S')}, {os.cpu_count()} cores, {N} workers, "
          f"model {args.model}, {args.epochs} epochs a run (the first excluded); settings "
          f"{','.join(args.settings)}; {len(configs(args.ranks))} configurations x {args.reps} "
          f"repetitions; {len(todo)} runs to do", flush=True)
    if args.dry_run or not todo:
        return 0
    hosts = Hosts(N)
    servers = Servers(args.python, hosts)
    t_start, failed, shaped = time.monotonic(), 0, None
    try:
        if any(s != "loopback" for s in args.settings):
            hosts.make()
        for rep, setting, reducer, k in todo:
            if time.monotonic() - t_start > 60 * args.budget_min:
                print(f"studies.time.run: --budget-min {args.budget_min} reached; rerun to resume",
                      file=sys.stderr)
                return 3
            if setting != "loopback" and setting != shaped:
                hosts.shape(setting)
                hosts.calibrate(os.path.join(args.results, setting))  # refused if it fails
                shaped = setting
            out = os.path.join(args.results, setting, name(args.model, reducer, k, rep) + ".json")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            argv = ["--model", args.model, "--reducer", reducer, "--rank", str(k or 4),
                    "--epochs", str(args.epochs), "--seed", str(rep), "--timeout", str(args.timeout),
                    "--out", out]
            t0 = time.monotonic()
            port = 20000 + (os.getpid() % 600) * 20 + todo.index((rep, setting, reducer, k)) % 20
            d, note = servers.train(setting, argv, out, port)
            if d:
                ms = [e["batch_ms_mean"] for e in d["epochs"][1:]]
                note = f"{sum(ms) / max(1, len(ms)):.1f} ms/batch after epoch 1"
            else:
                failed += 1
            print(f"{time.strftime('%H:%M:%S')} rep {rep} {setting} {reducer}"
                  + (f" k={k}" if k else "") + f": {time.monotonic() - t0:.0f} s, {note}", flush=True)
    finally:
        servers.close()
        hosts.down()
    print(f"# time_study: done in {(time.monotonic() - t_start) / 60:.0f} min, {failed} runs failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
