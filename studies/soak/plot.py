#!/usr/bin/python3
"""The memory curve of a soak run (tests/soak) for docs/soak.md.

usage: /usr/bin/python3 -m studies.soak.plot [--csv studies/soak/results/soak_memory.csv]
           [--out docs/img/soak_memory.png] [--margin-mb 64]
The CSV is the soak's --csv output: one row per call (row 0: the baseline, before any buffer) with
resident memory, resident memory after malloc_trim where every buffer was just released (drains),
lowrank's state bytes (all ranks) and the live buffers.
"""
import argparse
import csv
import os

from studies.lib.figures import pyplot

plt = pyplot("studies/soak/plot.py")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=os.path.join(HERE, "results", "soak_memory.csv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/img/soak_memory.png"))
    ap.add_argument("--margin-mb", type=float, default=64.0,
                    help="the soak's margin over the baseline (its --margin-mb)")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    call = [int(r["call"]) for r in rows]
    rss = [float(r["rss_mb"]) for r in rows]
    state = [float(r["state_mb"]) for r in rows]
    live = [int(r["live_buffers"]) for r in rows]
    drains = [(int(r["call"]), float(r["rss_trimmed_mb"])) for r in rows if r["rss_trimmed_mb"]]
    base = drains[0][1] if drains and drains[0][0] == 0 else rss[0]
    drains = [d for d in drains if d[0] != 0]

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})
    ax.plot(call, rss, lw=0.6, color="tab:blue", label="resident memory (RSS)")
    ax.plot(call, state, lw=0.6, color="tab:orange", label="lowrank state, all comm ranks")
    ax.axhline(base, color="gray", lw=0.8, ls="--", label=f"baseline {base:.0f} MB")
    ax.axhline(base + a.margin_mb, color="red", lw=0.8, ls=":",
               label=f"baseline + margin ({a.margin_mb:.0f} MB)")
    if drains:
        ax.scatter([d[0] for d in drains], [d[1] for d in drains], s=18, color="black", zorder=3,
                   label="RSS with every buffer released")
    ax.set_ylabel("MB")
    ax.set_title(f"soak: {call[-1]} calls, 4 comm ranks")
    ax.legend(fontsize=7, loc="upper right")
    bx.step(call, live, where="post", lw=0.6, color="tab:green")
    bx.set_ylabel("live buffers")
    bx.set_xlabel("call")
    fig.tight_layout()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
