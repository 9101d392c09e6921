#!/usr/bin/env python3
"""Checks --ids and --move: the gradients declared with tensor ids on a stable recvbuff, and on one
that alternates between two allocations (the ids declared on it at every call, FSDP's case), give
the same outputs bit for bit (--digest: every call of the row, warm-up, timed, accuracy, in-place
included), and the same ratio and p/q/exact elements as the anonymous layout; LOWRANK_START_ITER 2
too (warm-up per id). Bad combinations exit 2.

usage: check_ids.py PERF DATADIR [--step step0040]
"""
import argparse
import json
import os
import subprocess


def run(perf, datadir, step, extra, out, env=None):
    cmd = [perf, "-t", "3", "--gradients", datadir, "--step", step, "-k", "4", "-n", "3", "-w", "1",
           "--rounds", "3", "--triad-mib", "0", "--digest", "-J", out] + extra
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    print(p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: perf exited with status {p.returncode}")
    with open(out) as f:
        row = json.load(f)["results"][0]["lowrank"]
    digests = [l for l in p.stdout.splitlines() if l.startswith("# digest")]
    return digests, {k: row[k] for k in ("ratio", "p_elements", "q_elements", "exact_elements")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf")
    ap.add_argument("datadir")
    ap.add_argument("--step", default="step0040")
    a = ap.parse_args()
    fails = []
    _, anon = run(a.perf, a.datadir, a.step, [], "ids_anon.json")
    for env in ({}, {"LOWRANK_START_ITER": "2"}):
        d1, f1 = run(a.perf, a.datadir, a.step, ["--ids"], "ids.json", env)
        d2, f2 = run(a.perf, a.datadir, a.step, ["--ids", "--move"], "ids_move.json", env)
        if not d1 or d1 != d2:
            fails.append(f"{env}: --ids and --ids --move digests differ: {d1} vs {d2}")
        if f1 != anon or f2 != anon:
            fails.append(f"{env}: ratio/elements {f1}, {f2} (--ids, --move) vs {anon} (anonymous)")
    for bad in (["--ids"], ["--move", "--gradients", a.datadir]):
        rc = subprocess.run([a.perf] + bad, capture_output=True, timeout=60).returncode
        if rc != 2:
            fails.append(f"{' '.join(bad)}: exit status {rc}, 2 expected")
    for f in fails:
        print("FAIL:", f)
    if fails:
        raise SystemExit(1)
    print("OK")


if __name__ == "__main__":
    main()
