#!/usr/bin/env python3
"""Runs lowrank_allreduce_perf on synthetic inputs whose sum is exactly of rank k (-c 1) for several
approximation ranks k and comm-rank counts -t, and checks that every row of every run has
#wrong == 0 (out-of-place and in-place) and that the run exits 0.

usage: check_exact.py PERF [--ks 1,2,4,8] [--threads 1,3,4,8] [--min 1K] [--max 64M] [--prefix exact]
"""
import argparse
import json
import os
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("perf")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--threads", default="1,3,4,8")
    ap.add_argument("--min", default="1K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", default="4")
    ap.add_argument("--prefix", default="exact", help="the JSON files: PREFIX_tT_kK.json")
    ap.add_argument("--rounds", default="1", help="cumrelerr is not checked here: 1 keeps it fast")
    a = ap.parse_args()

    fails = []
    nrows = 0
    for t in a.threads.split(","):
        for k in a.ks.split(","):
            out = f"{a.prefix}_t{t}_k{k}.json"
            if os.path.exists(out):
                os.remove(out)
            cmd = [a.perf, "-t", t, "-k", k, "-c", "1", "-n", "1", "-w", "0", "-b", a.min,
                   "-e", a.max, "-f", a.factor, "--rounds", a.rounds, "-J", out]
            t0 = time.time()
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            dt = time.time() - t0
            print(f"+ {' '.join(cmd)}  ({dt:.1f} s, exit {p.returncode})", flush=True)
            if p.returncode != 0:
                print(p.stdout)
                fails.append(f"t={t} k={k}: exit status {p.returncode}")
            if not os.path.exists(out):
                fails.append(f"t={t} k={k}: no JSON written")
                continue
            with open(out) as f:
                d = json.load(f)
            rows = d.get("results", [])
            if not rows:
                fails.append(f"t={t} k={k}: no rows")
            for r in rows:
                nrows += 1
                for place in ("out_of_place", "in_place"):
                    w = (r.get(place) or {}).get("nwrong")
                    if w is None or int(w) != 0:
                        fails.append(f"t={t} k={k} size {r.get('size')} {place}: nwrong {w} "
                                     f"(relerr {(r.get('lowrank') or {}).get('relerr')})")
    print(f"{nrows} rows checked")
    for msg in fails:
        print("FAIL:", msg)
    if not fails:
        print("OK")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
