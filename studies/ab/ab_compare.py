#!/usr/bin/env python3
"""A/B timing of two lowrank_allreduce_perf binaries (two builds, e.g. a change and the commit before it),
interleaved in one run: A B A B ..., one pair after the other, so that the machine's drift (other
jobs, clock, caches) falls on both sides of every pair.

  PYTHONPATH=.:python /usr/bin/python3 -m studies.ab.ab_compare --base BASE_BUILD/perf/lowrank_allreduce_perf \
      --cand CAND_BUILD/perf/lowrank_allreduce_perf --pairs 12 --out /tmp/ab [-- PERF ARGS]

Default perf arguments: ResNet-50 shapes (studies/lib/gradsets.py resnet50, made once in --grads if missing),
world 4 (-t 4, comm ranks as threads), k = 4, powersgd, -n 5 -w 2, --rounds 1, --phases 1, --triad-mib 0.
Each run writes its JSON (-J); per pair the script takes cand/base of
  - oop: the out-of-place time per call (the perf binary's `time`, max over comm ranks),
  - inp: the in-place time per call,
  - compute, comm: compute_us and comm_us (each phase alone; --phases 1),
  - wall: the whole process's wall time (reading the gradient files included).
  - call: the time per call of out-of-place and in-place calls together ((oop + inp) / 2: all of a
    run's timed calls, so less noisy than either alone).
The 95% interval of a ratio: the per-pair ratios' logarithms, mean +- t(0.975, n-1) * sd / sqrt(n),
exponentiated (the interval of the geometric mean ratio); "upper95" is the one-sided 95% upper bound,
mean + t(0.95, n-1) * sd / sqrt(n), the test of "no slowdown" (studies/lib/stats.py: paired_ratio,
paired_ratio_upper_bound; exact quantiles). --verdict METRIC:BOUND states, before
the run, the metric and bound that decide: "no slowdown shown" when its upper95 <= BOUND, otherwise
"not shown". --alternate runs base first in the first pair run (the warm-up, when there is one)
and swaps the order in every pair after it (each pair's order is in runs.json), so that a run's
place in its pair (a warmer cache, the other's leftovers) falls on both sides alike.
The load average is read before every run.
--wait-quiet N: before each pair, wait until at most N tasks are runnable (a shared machine's quiet
moment, decided before the pair, never from a result). --logs: compute the same statistics from the
printed output of an interleaved run made by another harness (every run's output appended in order).
Writes OUT/runs.json (every run, with the sha256 of the library its side loaded), OUT/summary.json
(with each side's library: "provenance", studies/lib/provenance.py) and OUT/summary.md; prints the
summary.
Needs scipy (studies/lib/stats.py; Debian's python3-scipy); run from the checkout's root as a
module, as above. First use: studies/ab/results/issue15_ab.md.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

from studies.lib import provenance, stats

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIDENCE = 0.95        # the two-sided interval's central coverage
BOUND_CONFIDENCE = 0.95  # the one-sided upper bound's coverage (upper95, --verdict)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def procs_running():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 0


def wait_quiet(limit, longest):
    """Waits (at most `longest` seconds) until /proc/stat's procs_running (this script's own reading
    included) is <= limit on 4 readings in a row, 0.25 s apart. Decided before a pair starts, from
    the machine alone: it skips busy moments without looking at any result. Returns the seconds waited."""
    t0 = time.perf_counter()
    calm = 0
    while calm < 4 and time.perf_counter() - t0 < longest:
        calm = calm + 1 if procs_running() <= limit else 0
        time.sleep(0.25)
    return time.perf_counter() - t0


def run_one(binary, perf_args, json_path, env, library_sha256):
    """Runs the perf binary once (its JSON at json_path, its output beside it as .log) and returns
    the run's numbers. library_sha256 (the library its side loads, read when the harness started)
    goes into the run's JSON and the returned dict, so that each result names its library."""
    cmd = [binary] + perf_args + ["-J", json_path]
    load = loadavg()
    t0 = time.perf_counter()
    log_path = json_path[:-len(".json")] + ".log"
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        with open(log_path) as log:
            sys.stderr.write(log.read())
        raise SystemExit(f"ab_compare: {' '.join(cmd)} exited with {rc}")
    with open(json_path) as f:
        j = json.load(f)
    j["library_sha256"] = library_sha256
    with open(json_path, "w") as f:
        json.dump(j, f, indent=2)
    res = [r for r in j["results"] if r["lowrank"]["mode"] == "powersgd"]
    if len(res) != 1:
        raise SystemExit(f"ab_compare: expected one powersgd row in {json_path}, found {len(res)}")
    r = res[0]
    lr = r["lowrank"]
    return {"cmd": cmd, "load_before": load, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
            "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "nivcsw": ru.ru_nivcsw,
            "oop_us": r["out_of_place"]["time"], "inp_us": r["in_place"]["time"],
            "compute_us": lr.get("compute_us"), "comm_us": lr.get("comm_us"),
            "relerr": lr.get("relerr"), "ratio": lr.get("ratio"), "wire_bytes": lr.get("wire_bytes"),
            "library_sha256": library_sha256}


def parse_text(text):
    """The perf binary's printed tables, one per run (a run starts at its '# lowrank_allreduce_perf:'
    line): per run, the powersgd row's times (us) and relerr."""
    runs = []
    for chunk in text.split("# lowrank_allreduce_perf:")[1:]:
        rows = [ln.split() for ln in chunk.splitlines() if ln.strip() and not ln.startswith("#")]
        rows = [r for r in rows if len(r) > 13 and r[13] == "powersgd"]
        if len(rows) != 1:
            raise SystemExit(f"ab_compare: expected one powersgd row per run, found {len(rows)}")
        r = rows[0]
        num = lambda v: None if v == "-" else float(v)  # noqa: E731
        runs.append({"oop_us": float(r[5]), "inp_us": float(r[9]), "relerr": num(r[16]),
                     "compute_us": num(r[19]) if len(r) > 19 else None,
                     "comm_us": num(r[20]) if len(r) > 20 else None,
                     "load_before": None, "wall_s": None, "cpu_s": None, "user_s": None})
    return runs


def summarize(counted):
    """{metric key: its statistics} over the counted pairs (each with "base" and "cand" runs):
    per metric in METRICS that every run has, the per-pair ratios cand / base, their geometric
    mean with its CONFIDENCE interval (stats.paired_ratio), the one-sided BOUND_CONFIDENCE upper
    bound (stats.paired_ratio_upper_bound), the median ratio and each side's median. SystemExit
    for a value <= 0 (no ratio)."""
    out = {}
    for key, field, what in METRICS:
        if any(p[s][field] is None for p in counted for s in ("base", "cand")):
            continue
        if any(p[s][field] <= 0 for p in counted for s in ("base", "cand")):
            raise SystemExit(f"ab_compare: a run has {field} <= 0: no ratio can be taken")
        cand, base = [p["cand"][field] for p in counted], [p["base"][field] for p in counted]
        ratio = stats.paired_ratio(cand, base, CONFIDENCE)
        out[key] = {
            "what": what, "ratios": [c / b for c, b in zip(cand, base)], "geomean": ratio.estimate,
            "ci95": [ratio.low, ratio.high],
            "upper95": stats.paired_ratio_upper_bound(cand, base, BOUND_CONFIDENCE).upper,
            "median_ratio": statistics.median(c / b for c, b in zip(cand, base)),
            "base_median": statistics.median(base), "cand_median": statistics.median(cand)}
    return out


METRICS = [("oop", "oop_us", "out-of-place time per call"),
           ("inp", "inp_us", "in-place time per call"),
           ("call", "call_us", "time per call, out-of-place and in-place together"),
           ("compute", "compute_us", "compute_us (compression alone)"),
           ("comm", "comm_us", "comm_us (factor allreduces alone)"),
           ("wall", "wall_s", "whole process wall time"),
           ("cpu", "cpu_s", "whole process CPU time (user + sys)"),
           ("user", "user_s", "whole process user CPU time")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="baseline lowrank_allreduce_perf (with --logs: its log); required")
    ap.add_argument("--cand", help="candidate lowrank_allreduce_perf (with --logs: its log); required")
    ap.add_argument("--logs", action="store_true",
                    help="run nothing: --base and --cand are the printed output of an interleaved run made by "
                         "another harness, every run's output appended in order, the warm-up runs first")
    ap.add_argument("--from-runs", action="store_true",
                    help="run nothing: recompute OUT/summary.{json,md} from OUT/runs.json, with the "
                         "header (binaries, labels, times, perf arguments, verdict) of OUT/summary.json")
    ap.add_argument("--pairs", type=int, default=12, help="counted pairs (default 12)")
    ap.add_argument("--warmup-pairs", type=int, default=1, help="pairs run first, not counted (default 1)")
    ap.add_argument("--grads", default="/tmp/lowrank-gradsets/resnet50", help="gradient files (made if missing)")
    ap.add_argument("--out", required=True, help="folder for the JSON files and the summary")
    ap.add_argument("--wait-quiet", type=int, default=0, metavar="N",
                    help="before each pair, wait until at most N tasks are runnable (procs_running; 0: no wait)")
    ap.add_argument("--wait-longest", type=float, default=60.0, help="seconds, the longest such wait (default 60)")
    ap.add_argument("--alternate", action="store_true",
                    help="base first in the first pair run (the warm-up), the order swapped in every "
                         "pair after it (default: base first always)")
    ap.add_argument("--verdict", metavar="METRIC:BOUND",
                    help="the decision stated before the run: no slowdown shown when METRIC's one-sided "
                         "95%% upper bound is <= BOUND (e.g. call:1.03)")
    ap.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable set for the base side's runs only (repeatable): "
                         "one binary, two settings, e.g. --base-env LOWRANK_ALTERNATE=0 "
                         "--cand-env LOWRANK_ALTERNATE=1")
    ap.add_argument("--cand-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--label-base", default="base")
    ap.add_argument("--label-cand", default="cand")
    ap.add_argument("perf_args", nargs="*", help="after --: the perf binary's arguments (without -J)")
    a = ap.parse_args()
    old = None
    if a.from_runs:
        if a.logs:
            ap.error("--from-runs and --logs: one source of runs")
        try:
            with open(os.path.join(a.out, "summary.json")) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--from-runs: cannot read {a.out}/summary.json ({e})")
        a.base, a.cand = old["base"], old["cand"]
        a.label_base, a.label_cand = old["label_base"], old["label_cand"]
        if a.verdict is None and old.get("verdict"):
            a.verdict = f"{old['verdict']['metric']}:{old['verdict']['bound']}"
    elif a.base is None or a.cand is None:
        ap.error("--base and --cand are required (except with --from-runs)")
    verdict = None
    if a.verdict is not None:
        key, _, bound = a.verdict.partition(":")
        if key not in [m[0] for m in METRICS]:
            ap.error(f"--verdict {a.verdict}: {key!r} is not one of {[m[0] for m in METRICS]}")
        try:
            verdict = (key, float(bound))
        except ValueError:
            ap.error(f"--verdict {a.verdict}: the bound {bound!r} is not a number")
        if not (verdict[1] > 0 and math.isfinite(verdict[1])):
            ap.error(f"--verdict {a.verdict}: the bound must be a finite number > 0")
    if a.alternate and a.logs:
        ap.error("--alternate runs the pairs; with --logs the order is the other harness's")
    if a.pairs < 2:
        ap.error("--pairs must be at least 2 (an interval needs two pairs)")

    if not a.from_runs and not os.path.exists(os.path.join(a.grads, "synth_worker0.safetensors")):
        subprocess.run([sys.executable, os.path.join(HERE, "..", "lib", "gradsets.py"), "resnet50", a.grads, "4"], check=True)
    perf_args = a.perf_args or ["-t", "4", "--gradients", a.grads, "--step", "synth", "-k", "4",
                                "--mode", "powersgd", "-n", "5", "-w", "2", "--rounds", "1",
                                "--phases", "1", "--triad-mib", "0"]
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # each binary finds its own liblowrank.so (build rpath)
    side_env = {}
    for side, pairs in (("base", a.base_env), ("cand", a.cand_env)):
        side_env[side] = dict(env)
        for kv in pairs:
            if "=" not in kv:
                raise SystemExit(f"ab_compare: --{side}-env {kv!r}: expected NAME=VALUE")
            k, v = kv.split("=", 1)
            side_env[side][k] = v

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # each side's library (the one its binary loads); none for runs another harness made
    records = None if a.logs or a.from_runs else {side: provenance.start(binary=b) for side, b in
                                   (("base", a.base), ("cand", a.cand))}
    runs = []
    total = 0 if a.logs or a.from_runs else a.warmup_pairs + a.pairs
    if a.from_runs:
        with open(os.path.join(a.out, "runs.json")) as f:
            runs = json.load(f)
        started, ended, perf_args = old["started"], old["ended"], old["perf_args"]
        a.alternate = any(p.get("order", ["base"])[0] == "cand" for p in runs)
    if a.logs:
        with open(a.base) as f:
            base_runs = parse_text(f.read())
        with open(a.cand) as f:
            cand_runs = parse_text(f.read())
        if len(base_runs) != len(cand_runs):
            raise SystemExit(f"ab_compare: {a.base} has {len(base_runs)} runs, {a.cand} "
                             f"{len(cand_runs)}: pairs need the same number")
        n = len(base_runs)
        if n - a.warmup_pairs < 2:
            raise SystemExit(f"ab_compare: {n} runs each with {a.warmup_pairs} warm-up pairs leave "
                             "fewer than 2 counted pairs")
        for i in range(n):
            runs.append({"index": i - a.warmup_pairs, "counted": i >= a.warmup_pairs,
                         "base": base_runs[i], "cand": cand_runs[i]})
        started = ended = "(from logs)"
        with open(a.base) as f:
            first = f.readline()
        if first.startswith("# lowrank_allreduce_perf:"):
            perf_args = first.split()[3:]
    for i in range(total):
        counted = i >= a.warmup_pairs
        pair = {"index": i - a.warmup_pairs, "counted": counted}
        if a.wait_quiet > 0:
            pair["waited_s"] = wait_quiet(a.wait_quiet, a.wait_longest)
        order = (("base", a.base), ("cand", a.cand))
        if a.alternate and i % 2 == 1:
            order = order[::-1]
        pair["order"] = [side for side, _ in order]
        for side, binary in order:
            # each run names the library it loaded (its side's, read when the harness started)
            pair[side] = run_one(binary, perf_args, os.path.join(a.out, f"{side}_{i:02d}.json"),
                                 side_env[side],
                                 provenance.library_sha256({"provenance": records[side]}))
        runs.append(pair)
        tag = f"pair {pair['index']:2d}" if counted else "warm-up"
        b, c = pair["base"], pair["cand"]
        print(f"{tag}: base {b['oop_us'] / 1e3:8.1f} ms  cand {c['oop_us'] / 1e3:8.1f} ms"
              f"  ratio {c['oop_us'] / b['oop_us']:.4f}  load {b['load_before'][0]:.2f}", flush=True)
    if not (a.logs or a.from_runs):
        ended = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    counted = [p for p in runs if p["counted"]]
    for p in runs:
        for s in ("base", "cand"):
            p[s]["call_us"] = (p[s]["oop_us"] + p[s]["inp_us"]) / 2
    summary = {"started": started, "ended": ended, "pairs": len(counted), "perf_args": perf_args,
               "base_env": a.base_env, "cand_env": a.cand_env,
               "base": a.base, "cand": a.cand, "label_base": a.label_base, "label_cand": a.label_cand,
               "provenance": (old.get("provenance") if a.from_runs else
                              records and {side: provenance.finish(r) for side, r in records.items()}),
               "load_1min": [p[s]["load_before"][0] for p in counted for s in ("base", "cand")
                             if p[s]["load_before"] is not None],
               "metrics": summarize(counted)}
    undecided = False
    if verdict:
        key, bound = verdict
        up = summary["metrics"].get(key, {}).get("upper95")
        undecided = key not in summary["metrics"]  # the runs are written all the same, then exit 1
        decision = ("undecided: the runs lack this metric (wall and cpu need runs made here; "
                    "compute and comm need --phases 1)" if undecided else
                    "no slowdown shown" if up is not None and up <= bound else "not shown")
        summary["verdict"] = {"metric": key, "bound": bound, "upper95": up, "decision": decision}
    if not a.from_runs:
        with open(os.path.join(a.out, "runs.json"), "w") as f:
            json.dump(runs, f, indent=1)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    firsts = [p.get("order", ["base"])[0] for p in counted]
    order_text = ("base first (as the other harness ran them)" if a.logs else
                  f"base first in {firsts.count('base')} counted pairs, cand first in "
                  f"{firsts.count('cand')}" + (" (alternating)" if a.alternate else ""))
    loads = summary["load_1min"]
    lines = [f"# A/B: {a.label_cand} / {a.label_base}, {len(counted)} interleaved pairs", "",
             f"- {started} .. {ended}; load average (1 min) before each run: " +
             (f"min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f}"
              if loads else "not recorded"),
             f"- base: `{a.base}`", f"- cand: `{a.cand}`",
             f"- perf arguments: `{' '.join(perf_args)}`",
             f"- order within a pair: {order_text}", "",
             "| metric | base median | cand median | geomean ratio cand/base | 95% interval | upper95 (one-sided) | median ratio |",
             "|---|---|---|---|---|---|---|"]
    for key, m in summary["metrics"].items():
        unit = "s" if key in ("wall", "cpu", "user") else "ms"
        scale = 1.0 if unit == "s" else 1e-3
        lo, hi = m["ci95"]
        up = "-" if m["upper95"] is None else f"{m['upper95']:.4f}"
        lines.append(f"| {m['what']} | {m['base_median'] * scale:.2f} {unit} | {m['cand_median'] * scale:.2f} {unit} | "
                     f"{m['geomean']:.4f} | {'-' if lo is None else f'[{lo:.4f}, {hi:.4f}]'} | "
                     f"{up} | {m['median_ratio']:.4f} |")
    if "verdict" in summary:
        v = summary["verdict"]
        up = "-" if v["upper95"] is None else f"{v['upper95']:.4f}"
        lines += ["", f"**Verdict (stated before the run: {v['metric']}'s one-sided 95% upper bound <= "
                  f"{v['bound']}): {v['decision']}** (upper95 {up})"]
    lines += ["", "| pair | load | base oop ms | cand oop ms | oop ratio | base inp ms | cand inp ms | inp ratio | "
              "base compute ms | cand compute ms | base comm ms | cand comm ms | base wall s | cand wall s | "
              "base cpu s | cand cpu s | cpu ratio |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in counted:
        b, c = p["base"], p["cand"]
        def ms(v):
            return "-" if v is None else f"{v / 1e3:.1f}"

        def sec(v):
            return "-" if v is None else f"{v:.2f}"

        def rat(x, y):
            return "-" if x is None or y is None else f"{x / y:.4f}"
        load = "-" if b["load_before"] is None else f"{b['load_before'][0]:.2f}"
        lines.append(f"| {p['index']} | {load} | {ms(b['oop_us'])} | {ms(c['oop_us'])} | "
                     f"{rat(c['oop_us'], b['oop_us'])} | {ms(b['inp_us'])} | {ms(c['inp_us'])} | "
                     f"{rat(c['inp_us'], b['inp_us'])} | {ms(b['compute_us'])} | {ms(c['compute_us'])} | "
                     f"{ms(b['comm_us'])} | {ms(c['comm_us'])} | {sec(b['wall_s'])} | {sec(c['wall_s'])} | "
                     f"{sec(b['cpu_s'])} | {sec(c['cpu_s'])} | {rat(c['cpu_s'], b['cpu_s'])} |")
    relerrs = {(p[s]["relerr"]) for p in counted for s in ("base", "cand")}
    lines += ["", f"- relerr of the first compressed call, all runs: {sorted(relerrs)}"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if undecided else 0


if __name__ == "__main__":
    sys.exit(main())
