"""The report of studies/netns/alternate_hosts.sh (issue 44 on the honest wire): alternating PowerSGD
against PowerSGD, the same perf binary, pairs of runs per host count.

Reads the driver's lists (runs: "H PAIR SIDE WALL_S PREFIX" or "H PAIR SIDE FAILED PREFIX";
calibrations: "H passed|failed FILE"; quiet: "H PAIR WAITED_S BUSY") and each run's rank JSONs
(PREFIX.r<i>.json) and rank 0's output (PREFIX.o0: the schedule and transport lines). Writes
OUT.json (every run's rows as the perf binary wrote them, rank 0's; the per-rank wire bytes; the
transport chosen; the calibrations whole; provenance) and OUT.md (per host count the pairs, the
ratios and the verdict).

Per run: comm_us and time per call (out-of-place) as the slowest rank's (max over the rank JSONs;
perf already takes the max over comm ranks), wire_bytes per call per rank. Per host count: the
geometric-mean ratio alternate / PowerSGD over the pairs with its two-sided 95% interval
(stats.paired_ratio) and its one-sided 95% upper bound (stats.paired_ratio_upper_bound); the
verdict on comm_us: upper <= --bound is "met", else "not met"; fewer than 2 complete pairs or a
refused calibration: "not measured"."""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from studies.lib import calibrate, provenance, stats  # noqa: E402


def load_run(prefix):
    files = sorted(glob.glob(prefix + ".r*.json"), key=lambda f: int(re.search(r"\.r(\d+)\.json$", f)[1]))
    js = [json.load(open(f)) for f in files]
    rows = [j["results"][0] for j in js]
    lr = [r["lowrank"] for r in rows]
    notes = [l.rstrip("\n") for l in open(prefix + ".o0") if l.startswith("#")]
    sched = [l for l in notes if "schedule" in l]
    transport = {}
    for l in notes:
        m = re.match(r"# *transport \((\w+) comm", l)
        if m and "{" in l:
            transport[m[1]] = json.loads(l[l.index("{"):])
    return dict(nranks=js[0]["nranks"], command_line=js[0]["command_line"], results=js[0]["results"],
                alternate=lr[0]["alternate"], schedule=sched[0] if sched else None, transport=transport,
                time_us=max(r["out_of_place"]["time"] for r in rows),
                in_place_us=max(r["in_place"]["time"] for r in rows),
                comm_us=max(l["comm_us"] for l in lr), compute_us=max(l["compute_us"] or 0 for l in lr),
                wire_bytes=[l["wire_bytes"] for l in lr])


def ratio(alt, base):
    iv, ub = stats.paired_ratio(alt, base), stats.paired_ratio_upper_bound(alt, base)
    return dict(estimate=iv.estimate, low95=iv.low, high95=iv.high, upper95_one_sided=ub.upper,
                per_pair=[a / b for a, b in zip(alt, base)])


def digest(rev):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "source_revision.py"), "--digest", rev],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    for k in ("runs", "calibs", "quiet", "provenance", "out", "perf", "gradients", "rate", "delay", "link"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--bound", type=float, required=True)
    ap.add_argument("--pairs", type=int, required=True)
    ap.add_argument("--built-from")
    a = ap.parse_args()
    calibs = {}
    for line in open(a.calibs):
        h, word, path = line.split()
        calibs[int(h)] = dict(passed=word == "passed", calibration=json.load(open(path)))
    quiet = {}
    for line in open(a.quiet):
        h, p, w, b = line.split()
        quiet[(int(h), int(p))] = dict(waited_s=float(w), busy=float(b))
    runs, failed = {}, []
    for line in open(a.runs):
        h, p, side, wall, prefix = line.split()
        key = (int(h), int(p), side)
        if wall == "FAILED":
            failed.append(dict(hosts=int(h), pair=int(p), side=side,
                               tail=open(prefix + ".o0").read().splitlines()[-8:]))
            continue
        r = load_run(prefix)
        if r["alternate"] != (side == "alternate"):
            sys.exit(f"alternate_report.py: {prefix}: lowrank.alternate {r['alternate']} on the {side} side")
        r.update(hosts=int(h), pair=int(p), side=side, wall_s=float(wall), **quiet.get((int(h), int(p)), {}))
        runs[key] = r

    per_hosts = {}
    for h in sorted(calibs):
        pairs = sorted({p for (hh, p, s) in runs if hh == h})
        pairs = [p for p in pairs if (h, p, "powersgd") in runs and (h, p, "alternate") in runs]
        res = dict(hosts=h, calibration_passed=calibs[h]["passed"], pairs=pairs)
        if len(pairs) >= 2:
            g = lambda side, k: [runs[(h, p, side)][k] for p in pairs]  # noqa: E731
            res["comm_ratio"] = ratio(g("alternate", "comm_us"), g("powersgd", "comm_us"))
            res["time_ratio"] = ratio(g("alternate", "time_us"), g("powersgd", "time_us"))
            res["in_place_ratio"] = ratio(g("alternate", "in_place_us"), g("powersgd", "in_place_us"))
            for side in ("powersgd", "alternate"):
                res[side] = dict(comm_us_median=statistics.median(g(side, "comm_us")),
                                 time_us_median=statistics.median(g(side, "time_us")),
                                 wire_bytes_rank0=sorted({w[0] for w in g(side, "wire_bytes")}),
                                 wire_bytes_mean_over_ranks=statistics.fmean(
                                     statistics.fmean(w) for w in g(side, "wire_bytes")))
            up = res["comm_ratio"]["upper95_one_sided"]
            res["verdict"] = "met" if up <= a.bound else "not met"
        else:
            res["verdict"] = "not measured" + ("" if calibs[h]["passed"] else " (calibration failed)")
        per_hosts[h] = res

    prov = provenance.finish(json.load(open(a.provenance)))
    lib = prov.get("library") or {}
    libcheck = dict(library_sources_digest=lib.get("sources_digest"), revision=prov.get("revision"),
                    revision_sources_digest=digest(prov.get("revision", "HEAD")))
    if a.built_from:
        libcheck.update(built_from=a.built_from, built_from_sources_digest=digest(a.built_from))
        libcheck["library_matches_built_from"] = libcheck["built_from_sources_digest"] == lib.get("sources_digest")
    libcheck["library_matches_revision"] = libcheck["revision_sources_digest"] == lib.get("sources_digest")
    out = dict(issue=44, target="8 and 16 hosts, 1 ms one way, 100 Mbit/s: communication per call (comm_us) "
               f"of alternating at most {a.bound}x PowerSGD's (one-sided 95% upper bound)",
               perf=a.perf, gradients=a.gradients, rate=a.rate, delay=a.delay, link=a.link, bound=a.bound,
               pairs_planned=a.pairs, hosts=per_hosts, failed_runs=failed,
               runs=[runs[k] for k in sorted(runs)],
               calibration=[dict(hosts=h, **c) for h, c in sorted(calibs.items())],
               provenance=prov, library_check=libcheck)
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=1)

    md = [f"# Issue 44 on the honest wire: alternating PowerSGD against PowerSGD, {a.rate}, {a.delay} one way",
          "",
          f"ResNet-50 shapes (synthetic, studies/lib/gradsets.py), k = 4, one perf process per host, "
          f"link `{a.link}`; script studies/netns/alternate_hosts.sh, plan "
          "studies/netns/results/issue44_wire_plan.md. The same binary both sides "
          f"(`{a.perf}`), LOWRANK_ALTERNATE=0 (PowerSGD) / 1 (alternate); pairs in alternating order.",
          f"Revision {prov.get('revision')}; library {lib.get('library')} sha256 {lib.get('sha256')}, "
          f"sources digest {lib.get('sources_digest')}"
          + (f" = {a.built_from}'s: {libcheck['library_matches_built_from']}" if a.built_from else "")
          + f"; = the revision's: {libcheck['library_matches_revision']}.", ""]
    for h, res in per_hosts.items():
        md.append(f"## {h} hosts: **{res['verdict']}**")
        md.append("")
        if "comm_ratio" in res:
            c, t = res["comm_ratio"], res["time_ratio"]
            md += [f"- comm_us alternate/PowerSGD: geometric mean {c['estimate']:.3f} "
                   f"[95%: {c['low95']:.3f}, {c['high95']:.3f}], one-sided upper 95% "
                   f"**{c['upper95_one_sided']:.3f}** (bound {a.bound}) over {len(res['pairs'])} pairs",
                   f"- time per call (out-of-place) alternate/PowerSGD: {t['estimate']:.3f} "
                   f"[95%: {t['low95']:.3f}, {t['high95']:.3f}]; in-place {res['in_place_ratio']['estimate']:.3f}",
                   f"- wire bytes per call, rank 0: PowerSGD {res['powersgd']['wire_bytes_rank0']}, alternate "
                   f"{res['alternate']['wire_bytes_rank0']}; mean over ranks: PowerSGD "
                   f"{res['powersgd']['wire_bytes_mean_over_ranks']:.0f}, alternate "
                   f"{res['alternate']['wire_bytes_mean_over_ranks']:.0f} "
                   f"({res['alternate']['wire_bytes_mean_over_ranks'] / res['powersgd']['wire_bytes_mean_over_ranks']:.3f}x)",
                   "", "| pair | first | PowerSGD comm ms | alternate comm ms | ratio | PowerSGD call ms "
                   "| alternate call ms | ratio | busy before | waited s |", "|---|---|---|---|---|---|---|---|---|---|"]
            for i, p in enumerate(res["pairs"]):
                b, al = runs[(h, p, "powersgd")], runs[(h, p, "alternate")]
                md.append(f"| {p} | {'PowerSGD' if p % 2 else 'alternate'} | {b['comm_us'] / 1e3:.1f} | "
                          f"{al['comm_us'] / 1e3:.1f} | {c['per_pair'][i]:.3f} | {b['time_us'] / 1e3:.1f} | "
                          f"{al['time_us'] / 1e3:.1f} | {t['per_pair'][i]:.3f} | {b.get('busy', float('nan')):.2f} "
                          f"| {b.get('waited_s', float('nan')):.0f} |")
            tr = runs[(h, res["pairs"][0], "powersgd")]["transport"]
            md += ["", f"Transport chosen (pair {res['pairs'][0]}, PowerSGD run, comm rank 0): "
                   + "; ".join(f"{k}: {json.dumps(v)}" for k, v in tr.items())]
        md += ["", "Calibration:", "", "```", calibrate.describe(calibs[h]["calibration"]), "```", ""]
    if failed:
        md += ["## Failed runs", ""] + [f"- {f['hosts']} hosts, pair {f['pair']}, {f['side']}: "
                                        + " / ".join(f["tail"][-3:]) for f in failed]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if not failed and all(r["calibration_passed"] for r in per_hosts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
