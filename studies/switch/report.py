#!/usr/bin/env python3
"""The table of switching runs (studies/switch/driver.py), analysed by analysis.py: per setting
(label, hosts, approximation rank), per reducer the time per batch over runs, its ratio to
`local` and the overhead, with intervals by run (plan.toml's [analysis] confidence); the ratios
of overheads against issue 27's targets and their verdicts; socket bytes against each reducer's model. Names its input files, the
runs' git revisions and this report's.

  /usr/bin/python3 -m studies.switch.report studies/switch/results/main [more files or dirs]
      [--json summary.json] [--allow-dirty]
"""
import argparse
import dataclasses
import glob
import json
import os
import sys

from studies.lib import plan as planfile
from studies.lib import provenance
from studies.lib.runs import read_json
from studies.lib.provenance import revision
from studies.switch import analysis as sa

PLAN = planfile.load(__file__)  # its [provenance] allow: runs that check_run lets through


def inputs(paths):
    files = []
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"studies.switch.report: no such file or folder: {p}")
        files += sorted(f for f in glob.glob(os.path.join(p, "**", "*.json"), recursive=True)
                        if os.path.basename(f) != "summary.json") if os.path.isdir(p) else [p]
    return files


def _ci(iv, fmt="{:.1f}"):
    """An Interval of studies/lib/stats.py as "estimate [low, high]"; "—" for None (one run)."""
    if iv is None:
        return "—"
    return f"{fmt.format(iv.estimate)} [{fmt.format(iv.low)}, {fmt.format(iv.high)}]"


def _json(value):
    """json.dump's default: the statistics' results (frozen dataclasses) as dicts."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def report(files, allow_dirty=False):
    """(markdown lines, summary dict)."""
    lines = [f"Report at revision {revision()}; {len(files)} input files:"]
    groups, left_out, revs = {}, [], set()
    for f in files:
        d, why = read_json(f)
        if why:
            left_out.append((f, why))
            continue
        if not isinstance(d, dict) or d.get("kind") != "switch":
            left_out.append((f, "not a switching run"))
            continue
        provenance.check_run(d, PLAN, f)
        ok, why = sa.usable(d)
        if not ok and not (allow_dirty and why.startswith("uncommitted")):
            left_out.append((f, why))
            continue
        revs.add(d["machine"].get("git"))
        groups.setdefault(sa.setting_key(d), []).append((f, sa.run_summary(d), provenance.library_sha256(d)))
    lines += [f"- {f}" for f in files]
    lines += [f"Left out: {f}: {why}" for f, why in left_out]
    lines += [f"Runs' revisions: {', '.join(sorted(r for r in revs if r))}", ""]
    summary = {}
    c = f"{sa.CONFIDENCE:.0%}"
    for (setting, world, rank), runs in sorted(groups.items()):
        sums = [s for _, s, _ in runs]
        table = sa.compare(sums)
        is_target = setting in sa.TARGET_SETTINGS and rank == sa.TARGET_RANK
        tg = sa.targets(sums, is_target)
        summary[f"{setting}/{world}hosts/r{rank}"] = dict(runs=[f for f, _, _ in runs],
                                                          libraries=sorted({h for _, _, h in runs}),
                                                          table=table, targets=tg)
        lines += [f"### {setting}, {world} hosts, rank {rank}: {len(runs)} runs", "",
                  "Per run, each reducer's mean time per batch over its kept steps; over runs: the "
                  f"mean with its {c} t-interval, the median of the runs' medians, the ratio to "
                  f"`local` (geometric mean of the runs' ratios, {c} interval), the overhead over "
                  f"`local` (mean [{c}], median), the run delay per step, and socket payload bytes "
                  "per step (all ranks, sent minus retransmitted, `local`'s floor taken off) against the "
                  "model, and the bytes TCP retransmitted.", "",
                  "| reducer | runs | ms/batch | median | ratio to local | overhead ms | overhead median "
                  "| run delay ms/step | bytes/step | model | worst vs model | retransmitted/step |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in table.items():
            ratio = _ci(row["ratio_to_local"], "{:.3f}") if row.get("ratio_to_local") else "—"
            over = _ci(row["overhead_ms"]) if "overhead_ms" in row else "—"
            med = f"{row['overhead_median_ms']:.1f}" if "overhead_median_ms" in row else "—"
            worst = max(row.get("bytes_vs_model") or [0.0], key=abs)
            flag = f" (over {sa.BYTES_TOLERANCE:.0%})" if abs(worst) > sa.BYTES_TOLERANCE else ""
            lines.append(f"| {name} | {row['runs']} | {_ci(row['mean_ms'])} | {row['median_ms']:.1f} "
                         f"| {ratio} | {over} | {med} | {row['run_delay_ms']:.1f} | "
                         f"{row['bytes_per_step']:.0f} | {row['model_bytes_per_step']:.0f} | "
                         f"{100 * worst:+.1f}%{flag if name != 'local' else ''} | "
                         f"{row['retrans_per_step']:.0f} |")
        if any(row.get("ss_bytes_per_step") is not None or row.get("link_bytes_per_step") is not None
               for row in table.values()):
            lines += ["", "The other two byte counts per step, all ranks, as counted (nothing taken "
                      "off): `ss -tin`'s bytes_sent per host, and the link's tx bytes (headers and "
                      "ACKs included; on loopback every rank's count is the same shared `lo`).", "",
                      "| reducer | sockets (process) | ss -tin (host) | link tx |", "|---|---|---|---|"]
            for name, row in table.items():
                def fmt(v):
                    return "—" if v is None else f"{v:.0f}"
                lines.append(f"| {name} | {fmt(row['raw_bytes_per_step'])} | "
                             f"{fmt(row.get('ss_bytes_per_step'))} | {fmt(row.get('link_bytes_per_step'))} |")
        lines.append("")
        for t in tg:
            a, b = t["pair"]
            if "fieller" not in t:
                lines.append(f"- {a} / {b} overheads: {t['verdict']} ({t['reason']})")
                continue
            f = t["fieller"]
            iv = f"[{f.low:.3f}, {f.high:.3f}]" if f.bounded else f.kind
            lines.append(f"- {a} / {b} overheads, target <= {t['target']:.3g}: ratio of means "
                         f"{f.estimate:.3f}, Fieller {f.confidence:.0%} {iv}, median of runs' ratios "
                         f"{t['median_per_run']:.3f}; contrast {a} - {t['target']:.3g} x {b}: "
                         f"{_ci(t['contrast_ms'])} ms; time ratio {a}/{b} "
                         f"{_ci(t['time_ratio'], '{:.3f}')}: **{t['verdict']}** ({t['reason']})")
        if is_target:
            for name in ("lowrank", "lowrank-ring"):
                dev = (table.get(name) or {}).get("bytes_vs_model")
                if dev:
                    worst = max(dev, key=abs)
                    lines.append(f"- {name}'s socket bytes vs the ring's model, target within "
                                 f"{sa.BYTES_TOLERANCE:.0%} in every run: worst {100 * worst:+.1f}%: "
                                 f"**{'MET' if abs(worst) <= sa.BYTES_TOLERANCE else 'MISSED'}**")
        lines.append("")
    return lines, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run JSON files or folders holding them")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="keep runs from a tree with uncommitted changes (never for the doc)")
    args = ap.parse_args()
    files = inputs(args.paths)
    if not files:
        raise SystemExit("studies.switch.report: no JSON files in " + " ".join(args.paths))
    lines, summary = report(files, args.allow_dirty)
    if not summary:  # never overwrite a summary with an empty one
        sys.stderr.write("\n".join(lines) + "\n")
        raise SystemExit("studies.switch.report: no usable switching run in " + " ".join(args.paths))
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=_json)


if __name__ == "__main__":
    main()
