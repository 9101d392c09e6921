#!/usr/bin/python3
"""The host transport's cost model at scale, on paper (docs/benchmarks.md, "Choosing the host
allreduce algorithm"): for ResNet-50 and GPT-2 small at approximation rank k = 4, one compressed
call against one exact allreduce, at 64 .. 4096 comm ranks.

The formula is the transport's own (plugin/transport/ucx/cost_model.cc), run through the
lowrank_cost_model binary; this script only supplies the payloads and prints the table:
  PYTHONPATH=.:python /usr/bin/python3 -m studies.netns.cost_table [--binary build-host/perf/lowrank_cost_model] [--alpha-us A] [--beta-ns B]

One compressed call of a whole model as one buffer, not pipelined (LOWRANK_PIPELINE=0): two
allreduces one after the other, [exact part | P | 2 check elements] and then Q, all float32. Per
tensor, PyTorch's rule (docs/design.md): viewed as (shape[0], rest), compressed at k' = min(k, n, m)
if (n + m) k' 2 < n m. The exact allreduce: every parameter as float32, one allreduce.
"""
import argparse
import json
import os
import subprocess

from studies.lib.gradsets import gpt2_shapes, resnet50_shapes
from studies.lib.launch import ROOT

WORLDS = [64, 128, 256, 512, 1024, 2048, 4096]
CHECKS = 2  # float32 elements the engine appends to P (plugin/engine/plan.h)


def payloads(shapes, k=4, rate=2.0):
    """(first call's elements: exact + P + checks, second call's: Q, all parameters)."""
    p = q = exact = total = 0
    for s in shapes:
        numel = 1
        for d in s:
            numel *= d
        total += numel
        n = s[0]
        m = numel // n
        kk = min(k, n, m)
        if len(s) >= 2 and (n + m) * kk * rate < n * m:
            p += n * kk
            q += m * kk
        else:
            exact += numel
    return exact + p + CHECKS, q, total


def model(binary, extra, points):
    out = subprocess.run([binary] + extra + [f"{w}:{b}" for w, b in points], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def us(x):
    return f"{1e6 * x:,.0f}" if x >= 1e-4 else f"{1e6 * x:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build-host", "perf", "lowrank_cost_model"))
    ap.add_argument("--alpha-us", type=float)
    ap.add_argument("--beta-ns", type=float)
    a = ap.parse_args()
    extra = (["--alpha-us", str(a.alpha_us)] if a.alpha_us else []) + \
            (["--beta-ns", str(a.beta_ns)] if a.beta_ns else [])
    first = True
    for name, shapes in (("ResNet-50", resnet50_shapes()), ("GPT-2 small", gpt2_shapes())):
        c1, c2, total = payloads(shapes)
        points = [(w, b) for w in WORLDS for b in (4 * c1, 4 * c2, 4 * total)]
        rows = model(a.binary, extra, points)
        if first:
            r0 = rows[0]
            print(f"alpha = {1e6 * r0['alpha_s']:g} us per step, beta = {1e9 * r0['beta_s_per_byte']:g} ns "
                  "per byte; times in microseconds, modelled\n")
            first = False
        print(f"{name}, k = 4: compressed call = allreduce of {4 * c1:,} B (exact part, P, checks) "
              f"then of {4 * c2:,} B (Q); exact allreduce of {4 * total:,} B\n")
        print("| comm ranks | [exact, P]: algorithm | time | Q: algorithm | time | compressed call "
              "| (ring only) | exact: algorithm | time | exact / compressed |")
        print("|---:|---|---:|---|---:|---:|---:|---|---:|---:|")
        for i, w in enumerate(WORLDS):
            p, q, e = rows[3 * i: 3 * i + 3]
            t = lambda r: r["algorithms"][r["chosen"]]["seconds"]  # noqa: E731
            comp = t(p) + t(q)
            ring = p["algorithms"]["ring"]["seconds"] + q["algorithms"]["ring"]["seconds"]
            print(f"| {w} | {p['chosen']} | {us(t(p))} | {q['chosen']} | {us(t(q))} | {us(comp)} | {us(ring)} "
                  f"| {e['chosen']} | {us(t(e))} | {t(e) / comp:.1f} |")
        print()


if __name__ == "__main__":
    main()
