#!/usr/bin/env python3
"""Checks the perf binary's phase and bound fields (not speed: figures of speed come from the
benchmarks): triad_gbps and triad_shared_gbps at the top of the JSON; on the powersgd row
compute_us, comm_us, bound_us, bound_alone_us positive, compute_eff = bound_us / compute_us, and
p/q/exact elements as lowrankBufferGetView reports them (p + q + exact < count); on the exact row
compute_us 0 and comm_us the row's time; on the fp16 row both positive. Also --phases 0 and
--triad-mib 0 leave the fields null.

usage: check_phases.py PERF DATADIR [--step step0040]
"""
import argparse
import json
import subprocess
import sys


def run(perf, datadir, step, extra, out):
    cmd = [perf, "-t", "2", "--gradients", datadir, "--step", step, "-k", "4", "-n", "2", "-w", "1",
           "--rounds", "2", "--mode", "powersgd,exact,fp16", "--triad-mib", "16", "-J", out] + extra
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print(p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: perf exited with status {p.returncode}")
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf")
    ap.add_argument("datadir")
    ap.add_argument("--step", default="step0040")
    a = ap.parse_args()
    fails = []

    def need(cond, what):
        if not cond:
            fails.append(what)

    d = run(a.perf, a.datadir, a.step, [], "phases.json")
    need((d.get("triad_gbps") or 0) > 0, "triad_gbps > 0")
    need((d.get("triad_shared_gbps") or 0) > 0, "triad_shared_gbps > 0")
    rows = {r["lowrank"]["mode"]: r for r in d["results"]}
    p = rows["powersgd"]["lowrank"]
    for key in ("compute_us", "comm_us", "bound_us", "bound_alone_us", "compute_eff"):
        need((p.get(key) or 0) > 0, f"powersgd {key} > 0 (got {p.get(key)})")
    if p.get("compute_us") and p.get("bound_us"):
        need(abs(p["compute_eff"] - p["bound_us"] / p["compute_us"]) < 1e-9 * max(1, p["compute_eff"]),
             "compute_eff = bound_us / compute_us")
    n = rows["powersgd"]["count"]
    pe, qe, ee = p.get("p_elements"), p.get("q_elements"), p.get("exact_elements")
    need(all(isinstance(v, int) and v > 0 for v in (pe, qe, ee)), "p/q/exact elements reported")
    if all(isinstance(v, int) for v in (pe, qe, ee)):
        need(pe + qe + ee < n, "p + q + exact < count")
    e = rows["exact"]
    need(e["lowrank"].get("compute_us") == 0, "exact compute_us == 0")
    need(e["lowrank"].get("comm_us") == e["out_of_place"]["time"], "exact comm_us == its time")
    need(e["lowrank"].get("bound_us") is None, "exact bound_us null")
    f = rows["fp16"]["lowrank"]
    need((f.get("compute_us") or 0) > 0 and (f.get("comm_us") or 0) > 0, "fp16 compute/comm > 0")

    d = run(a.perf, a.datadir, a.step, ["--phases", "0", "--triad-mib", "0"], "nophases.json")
    need(d.get("triad_gbps") is None, "--triad-mib 0: triad_gbps null")
    for r in d["results"]:
        l = r["lowrank"]
        need(all(l.get(k) is None for k in ("compute_us", "comm_us", "bound_us", "compute_eff")),
             f"--phases 0: {l['mode']} phase fields null")
    for f_ in fails:
        print("FAIL:", f_)
    print("OK" if not fails else f"{len(fails)} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
