#!/usr/bin/env python3
"""Runs lowrank_allreduce_perf on the real gradients (digits_cnn, step0040, 4 comm ranks, k=4,
10 rounds) and checks the powersgd row of its JSON against PyTorch's PowerSGD reference values
(perf/data/README.md): ratio 36.6 within 1%, relerr <= 0.62 (top of the range over seeds),
cumrelerr within 3% of 0.257, relerr_opt present and below relerr.

usage: check_accuracy.py PERF DATADIR [--step step0040] [--out out.json]
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf")
    ap.add_argument("datadir")
    ap.add_argument("--step", default="step0040")
    ap.add_argument("--out", default="out.json")
    ap.add_argument("--ratio", type=float, default=36.6)
    ap.add_argument("--relerr-max", type=float, default=0.62)
    ap.add_argument("--cumrelerr", type=float, default=0.257)
    a = ap.parse_args()

    cmd = [a.perf, "-t", "4", "--gradients", a.datadir, "--step", a.step, "-k", "4",
           "--rounds", "10", "-J", a.out]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=540)
    print(p.stdout)
    if p.returncode != 0:
        print(f"FAIL: perf exited with status {p.returncode}")
        return 1
    with open(a.out) as f:
        d = json.load(f)
    rows = [r for r in d.get("results", []) if (r.get("lowrank") or {}).get("mode") == "powersgd"]
    if not rows:
        print("FAIL: no powersgd row in", a.out)
        return 1
    l = rows[0]["lowrank"]
    fails = []
    ratio, relerr, cum, opt = l.get("ratio"), l.get("relerr"), l.get("cumrelerr"), l.get("relerr_opt")
    if ratio is None or abs(ratio - a.ratio) / a.ratio >= 0.01:
        fails.append(f"ratio {ratio} not within 1% of {a.ratio}")
    if relerr is None or relerr > a.relerr_max:
        fails.append(f"relerr {relerr} above {a.relerr_max}")
    if cum is None or abs(cum - a.cumrelerr) / a.cumrelerr > 0.03:
        fails.append(f"cumrelerr {cum} not within 3% of {a.cumrelerr}")
    if opt is None or relerr is None or not opt < relerr:
        fails.append(f"relerr_opt {opt} missing or not below relerr {relerr}")
    print(f"ratio {ratio} relerr {relerr} cumrelerr {cum} relerr_opt {opt}")
    for msg in fails:
        print("FAIL:", msg)
    if not fails:
        print("OK")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
