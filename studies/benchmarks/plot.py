#!/usr/bin/python3
"""Plots of the benchmark results for docs/benchmarks.md (Debian's matplotlib, no display needed).

usage: /usr/bin/python3 -m studies.benchmarks.plot [--netns studies/netns/results/wire_netns.json]
           [--compare studies/compare_pytorch/results/compare_pytorch.json] [--outdir docs/img]
writes OUTDIR/netns_speedup.png (speedup over exact per link rate and mode, with the bounds) and
OUTDIR/vs_pytorch.png (time per call, powerSGD_hook against lowrank, per set, world and k).
"""
import argparse
import json
import os

from studies.lib.figures import pyplot

plt = pyplot("studies/benchmarks/plot.py")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def plot_netns(path, out):
    d = json.load(open(path))
    rows = [r for r in d["rows"] if r["mode"] != "exact" and r.get("speedup")]
    rates = list(dict.fromkeys(r["rate"] for r in d["rows"]))

    def label(r):
        if r["mode"] == "fp16":
            return "fp16"
        p = {0: "unpipelined", 1: "pipelined"}.get(r["pipeline"], f"pipeline {r['pipeline']}")
        return f"k={r['k']} {p}"
    labels = list(dict.fromkeys(label(r) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        xs, ys, bs, bo = [], [], [], []
        for i, rate in enumerate(rates):
            m = [r for r in rows if r["rate"] == rate and label(r) == lab]
            if not m:
                continue
            xs.append(i + (j - (len(labels) - 1) / 2) * width)
            ys.append(m[0]["speedup"])
            bs.append(m[0].get("bound"))
            bo.append(m[0].get("bound_own"))
        bars = ax.bar(xs, ys, width, label=lab)
        for x, y, b in zip(xs, ys, bs):
            if b:
                ax.plot([x - width / 2, x + width / 2], [b, b], color="black", lw=1.5)
            ax.text(x, y, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
        del bars
    ax.plot([], [], color="black", lw=1.5, label="bound (4 hosts on 2 shared cores)")
    ax.set_xticks(range(len(rates)))
    def baseline_ms(r):  # the faster exact (report.py's "baseline"); older reports had one exact row
        ex = [x for x in d["rows"] if x["rate"] == r and x["mode"] == "exact"]
        return next((x for x in ex if x.get("baseline")), ex[0])["time_us"] / 1e3
    ax.set_xticklabels([f"{r}\nfaster exact {baseline_ms(r):.0f} ms/call" for r in rates])
    ax.set_yscale("log")
    ax.set_ylabel("speedup over the faster exact allreduce (x)")
    links = (f"{d['link']} links, {d['delay']} one way" if d.get("link")
             else "tbf-shaped links, no delay")  # reports before issue 42 name no link
    ax.set_title(f"4 hosts (network namespaces, {links}), ResNet-50 shapes (25.6 M float32)\n"
                 f"{d['date'][:10]}, {d['cores']} cores shared by all hosts; lowrank {d['lowrank'].split()[0]}")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"written {out}")


def plot_compare(path, out):
    d = json.load(open(path))
    rows = [r for r in d["results"] if r["k"] in ("1", "2", "4") and r.get("torch_ms") and r.get("lowrank_ms")]
    cases = list(dict.fromkeys((r["set"], r["world"]) for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(3.2 * len(cases), 4), squeeze=False)
    for ax, (s, w) in zip(axes[0], cases):
        m = [r for r in rows if r["set"] == s and r["world"] == w]
        ks = [r["k"] for r in m]
        x = range(len(ks))
        ax.bar([i - 0.2 for i in x], [r["torch_ms"] for r in m], 0.4, label="torch powerSGD_hook")
        ax.bar([i + 0.2 for i in x], [r["lowrank_ms"] for r in m], 0.4, label="lowrank")
        for i, r in zip(x, m):
            ax.text(i + 0.2, r["lowrank_ms"], f"{r['speedup']:.1f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"k={k}" for k in ks])
        ax.set_title(f"{s}, world {w}", fontsize=9)
        ax.set_ylabel("ms per call")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("time per call, same gradients, gloo vs lowrank (CPU, 1 thread per rank); "
                 + d["header"][0], fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"written {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--netns", default=os.path.join(ROOT, "studies", "netns", "results", "wire_netns.json"))
    ap.add_argument("--compare", default=os.path.join(ROOT, "studies", "compare_pytorch", "results", "compare_pytorch.json"))
    ap.add_argument("--outdir", default=os.path.join(ROOT, "docs", "img"))
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if os.path.exists(a.netns):
        plot_netns(a.netns, os.path.join(a.outdir, "netns_speedup.png"))
    if os.path.exists(a.compare):
        plot_compare(a.compare, os.path.join(a.outdir, "vs_pytorch.png"))


if __name__ == "__main__":
    main()
