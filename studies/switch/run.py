#!/usr/bin/env python3
"""Issue 27's time study: switching runs (studies/switch/driver.py) over every setting, the run as the
unit. Settings "HOSTS:RATE": HOSTS workers, one per network namespace of studies/lib/netns_hosts.sh on
links shaped to RATE (tc's syntax) with the plan's one-way delay, or RATE "loopback" (plain processes over lo). With as many
hosts as cores, worker i is pinned to core i. Run i of every setting takes Latin-square row i
(--run-index i); runs go round the settings (run 0 of each, then run 1 of each, ...), the order of
settings rotated from one round to the next, so a slow change of the machine spreads over them.

Protocol guards: a tree with uncommitted changes runs nothing (every JSON must name a committed
revision); a run does not start while more than --max-busy of the machine's CPU time was busy
over the last 5 s (procstat.busy_fraction: the machine must be quiet, nothing else running; the
1-minute load average, which an earlier version used, made each run wait ~2 minutes for the
previous run's own load to decay). Resumable: a run whose JSON exists is not rerun; stops
before a run that would start past --budget-min. Then studies/switch/report.py makes the table.
The plan (settings, runs, guards, each run's blocks, the decision rule) is plan.toml beside this file.

  sudo /usr/bin/python3 -m studies.switch.run --python /work/venv2/bin/python
  /usr/bin/python3 -m studies.switch.run --dry-run               # the plan, nothing run

Writes studies/switch/results/<plan's results>/<hosts>h_<rate>/run<i>.json (and .log, rank 0's output). Needs
root (namespaces, tc, nice -20) unless every setting is loopback.
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
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", PLAN["results"])
DRIVER = "studies.switch.driver"
NAME = "studies.switch.run"


def parse_settings(text):
    out = []
    for item in text.split(","):
        hosts, _, rate = item.strip().partition(":")
        if not re.fullmatch(r"[0-9]+", hosts) or int(hosts) < 2 or not (
                rate == "loopback" or re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmg]?bit", rate)):
            raise SystemExit(f"{NAME}: bad setting {item!r} (HOSTS:RATE, e.g. 4:100mbit, "
                             "4:1gbit or 4:loopback; RATE in bits per second, tc's syntax)")
        if (int(hosts), rate) in out:
            raise SystemExit(f"{NAME}: setting {item!r} given twice")
        out.append((int(hosts), rate))
    return out


def plan(settings, runs):
    """(run index, hosts, rate) in the order run."""
    out = []
    for i in range(runs):
        k = i % len(settings)
        out += [(i, h, r) for h, r in settings[k:] + settings[:k]]
    return out


def out_path(results, i, hosts, rate):
    return os.path.join(results, f"{hosts}h_{rate}", f"run{i}.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default=",".join(PLAN["settings"]))
    ap.add_argument("--runs", type=int, default=PLAN["runs"], help="runs per setting (the issue: at least 6)")
    ap.add_argument("--switch-args", default="", help="more arguments for every driver.py run")
    ap.add_argument("--delay", default=PLAN["delay"],
                    help="one-way delay on every link (250us, 1ms, 0), the rate kept")
    add_run_args(ap, PLAN, RESULTS)
    args = ap.parse_args()
    settings = parse_settings(args.settings)
    if args.runs < 1:
        raise SystemExit(NAME + ": --runs must be at least 1")
    if not 0 <= args.max_busy < 1:
        raise SystemExit(NAME + ": --max-busy is a share of the CPU, in [0, 1)")
    todo = [c for c in plan(settings, args.runs) if not os.path.exists(out_path(args.results, *c))]
    print(f"# {NAME}: {len(settings)} settings x {args.runs} runs; {len(todo)} to do",
          flush=True)
    if args.dry_run or not todo:
        for c in todo:
            print(f"  run {c[0]} {c[1]} hosts {c[2]}")
        return 0
    provenance.refuse_unless_ready(NAME, ROOT, args.python,
                                   need_root=any(r != "loopback" for _, r in settings))
    hosts = {n: Hosts(n, tag=f"lrs{os.getpid() % 100000}n{n}")
             for n in sorted({h for h, r in settings if r != "loopback"})}
    loop = {n: Hosts(n) for n in sorted({h for h, r in settings if r == "loopback"})}
    servers, shaped, failed, t0 = {}, {}, 0, time.monotonic()
    try:
        for i, n, rate in todo:
            if not may_start(NAME, args, t0):
                return 3
            net = "loopback" if rate == "loopback" else "hosts"
            h = loop[n] if net == "loopback" else hosts[n]
            if net == "hosts" and not h.up:
                h.make()
            if net == "hosts" and shaped.get(n) != rate:
                h.shape(rate)
                h.delay(args.delay)
                # refused if the links fail; calibrations.jsonl beside the runs it covers
                h.calibrate(os.path.dirname(out_path(args.results, i, n, rate)))
                shaped[n] = rate
            key = (n, net)
            if key not in servers:
                servers[key] = Servers(args.python, h, driver=DRIVER,
                                                  pin=n <= (os.cpu_count() or 1))
            out = out_path(args.results, i, n, rate)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            ifname = "lo" if net == "loopback" else "eth0"
            argv = ["--run-index", str(i), "--setting", rate, "--timeout", str(args.timeout),
                    "--ifname", ifname, "--out", out] + (["--ss"] if net == "hosts" else []) \
                + args.switch_args.split()
            port = 21000 + (os.getpid() % 250) * 40 + todo.index((i, n, rate)) % 40
            ts = time.monotonic()
            rcs = servers[key].run(net if net == "loopback" else rate, argv, out[:-5] + ".log", port)
            ok = all(rc == 0 for rc in rcs) and os.path.exists(out)
            failed += not ok
            print(f"{time.strftime('%H:%M:%S')} run {i} {n} hosts {rate}: "
                  f"{time.monotonic() - ts:.0f} s, {'ok' if ok else f'FAILED {rcs}'}", flush=True)
    finally:
        for s in servers.values():
            s.close()
        for h in hosts.values():
            h.down()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
