#!/usr/bin/python3
"""The report of studies/netns/algorithms.sh: every algorithm per point, the model's choice, the best.

usage: python -m studies.netns.algorithms_report RUNS OUT MODEL CORES GIT CMDLINE DATE [PROVENANCE]
                                                                    (from algorithms.sh)
PROVENANCE: the runs' start record (python -m studies.lib.provenance start), kept in OUT.json.
RUNS lines: WORLD DELAY RATE REP ALGO ALPHA_US BETA_NS ITERS WALL_S PREFIX (rank r: PREFIX.r<r>.json);
rate "none" marks the CPU floor (no qdisc). Writes OUT.json, OUT.md (and OUT.png with matplotlib).

One sample = one run's time per call at a size: out-of-place, the mean over its -n calls, the slowest
rank (max over the ranks' JSON files); bytes = the busiest rank's bytesSent in one call (wire_bytes).
Per point: median over repetitions [min-max]. best = the forced algorithm with the lowest median;
auto is the default: the links measured when each communicator is made (LOWRANK_UCX_PROBE) and
the cost model's choice with those constants; its choice and constants are what the transport
reported (PREFIX.transport: lowrankCommGetTransportInfo of rank 0's exact communicator, the perf
binary's "# transport" line); runs without that record fall back to MODEL (lowrank_cost_model) at
the ALPHA_US and BETA_NS of the runs' line.
Flags: "cpu" where the CPU floor of the algorithm (same world, no qdisc) is > 20% of its time here
(the network did not dominate); ">10%" where auto / best > 1.10; "bytes" where auto sends > 1.1x
the ring's bytes while being slower than the ring ("slower": the 95% interval of auto / ring,
paired by repetition (the same rotation), lies above 1; studies.lib.stats.paired_ratio).
"""
import argparse
import collections
import glob
import json
import math
import os
import statistics
import subprocess

from studies.lib import provenance, stats

FORCED = ["ring", "halving_doubling", "recursive_doubling", "direct"]
SHORT = {"ring": "ring", "halving_doubling": "hd", "recursive_doubling": "rd", "direct": "direct", "auto": "auto"}


def load(runs):
    samples, meta, walls, transport = {}, {}, [], {}
    for line in open(runs):
        n, delay, rate, rep, algo, alpha, beta, iters, wall, prefix = line.split()
        if os.path.exists(prefix + ".transport") and os.path.getsize(prefix + ".transport"):
            transport.setdefault((int(n), delay, rate, algo), []).append(
                json.load(open(prefix + ".transport")))
        files = sorted(glob.glob(prefix + ".r*.json"))
        ranks = [json.load(open(f))["results"] for f in files]
        for rows in zip(*ranks):
            size = rows[0]["size"]
            s = dict(time_us=max(r["out_of_place"]["time"] for r in rows),
                     in_place_us=max(r["in_place"]["time"] for r in rows),
                     bytes=max(r["lowrank"]["wire_bytes"] or 0 for r in rows),
                     nwrong=sum((r["out_of_place"]["nwrong"] or 0) + (r["in_place"]["nwrong"] or 0) for r in rows),
                     rep=int(rep))
            samples.setdefault((int(n), delay, rate, algo, size), []).append(s)
        meta[(int(n), delay, rate)] = (float(alpha), float(beta))
        # calls in the run: 2 (out-of-place, in-place) x (iters + warm-up) per size; a rough figure
        walls.append(dict(world=int(n), delay=delay, rate=rate, algo=algo, wall_s=float(wall),
                          sizes=len(ranks[0]) if ranks else 0, iters=int(iters)))
    return samples, meta, walls, transport


def stat(ss, key="time_us"):
    v = [s[key] for s in ss]
    return dict(median=statistics.median(v), min=min(v), max=max(v), n=len(v))


def reported_choice(infos, size):
    """The algorithm the transport reported for size's class (floor(log2(bytes))), the most common
    over the runs; None if none reported it."""
    c = str(int(math.floor(math.log2(size))))
    got = collections.Counter(i["algorithms"][c] for i in infos if c in i.get("algorithms", {}))
    return got.most_common(1)[0][0] if got else None


def slower_than_ring(au, ring):
    """auto / ring paired by repetition: (ratio interval, True when its 95% interval lies above 1);
    (None, False) with fewer than 2 pairs."""
    a = {s["rep"]: s["time_us"] for s in au}
    r = {s["rep"]: s["time_us"] for s in ring}
    reps = sorted(set(a) & set(r))
    if len(reps) < 2:
        return None, False
    iv = stats.paired_ratio([a[k] for k in reps], [r[k] for k in reps])
    return [iv.low, iv.high], iv.low > 1


def chosen(model, n, size, alpha, beta):
    out = subprocess.run([model, "--alpha-us", str(alpha), "--beta-ns", str(beta), f"{n}:{size}"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["chosen"]


def analyse(samples, meta, model, transport=None):
    transport = transport or {}
    points = []
    for (n, delay, rate), (alpha, beta) in sorted(meta.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        if rate == "none":
            continue
        sizes = sorted({k[4] for k in samples if k[:3] == (n, delay, rate)})
        for size in sizes:
            p = dict(world=n, delay=delay, rate=rate, size=size, alpha_us=alpha, beta_ns=beta, algos={})
            for a in FORCED + ["auto"]:
                ss = samples.get((n, delay, rate, a, size))
                if not ss:
                    continue
                fl = samples.get((n, "0", "none", a, size))
                p["algos"][a] = dict(stat(ss), bytes=statistics.median(s["bytes"] for s in ss),
                                     nwrong=sum(s["nwrong"] for s in ss),
                                     floor_us=statistics.median(s["time_us"] for s in fl) if fl else None)
            forced = {a: v for a, v in p["algos"].items() if a in FORCED}
            if forced:
                p["best"] = min(forced, key=lambda a: forced[a]["median"])
            infos = transport.get((n, delay, rate, "auto"), [])
            p["model_choice"] = reported_choice(infos, size) or chosen(model, n, size, alpha, beta)
            p["choice_from"] = "transport" if reported_choice(infos, size) else "model binary"
            if infos:  # the constants the runs measured (median over them)
                p["measured"] = {k: statistics.median(i[k] for i in infos)
                                 for k in ("alpha_us", "overhead_us", "beta_ns_per_byte")}
                # what measuring cost when each communicator was made (the issue's <= 0.5 s)
                secs = [i["probe"]["seconds"] for i in infos if "seconds" in i.get("probe", {})]
                if secs:
                    p["measured"]["probe_seconds_median"] = statistics.median(secs)
                    p["measured"]["probe_seconds_max"] = max(secs)
            au, al = p["algos"].get("auto"), p["algos"]
            if au:
                # the floor of what auto ran is the floor of its choice (the floor runs force algorithms)
                fl = samples.get((n, "0", "none", p["model_choice"], size))
                au["floor_us"] = statistics.median(s["time_us"] for s in fl) if fl else None
                if "best" in p:
                    p["auto_over_best"] = au["median"] / al[p["best"]]["median"]
                    if p["model_choice"] in forced:  # else unknown: the choice was not run forced
                        p["picked_best"] = p["model_choice"] == p["best"]
                if "ring" in al:
                    p["ring_over_auto"] = al["ring"]["median"] / au["median"]
                    iv, slower = slower_than_ring(samples[(n, delay, rate, "auto", size)],
                                                  samples[(n, delay, rate, "ring", size)])
                    p["auto_over_ring_95"] = iv
                    p["bytes_flag"] = au["bytes"] > 1.1 * al["ring"]["bytes"] and slower
                if "direct" in al:
                    p["direct_over_auto"] = al["direct"]["median"] / au["median"]
            for v in al.values():
                v["cpu_flag"] = v["floor_us"] is not None and v["floor_us"] > 0.2 * v["median"]
            points.append(p)
    return points


def us(x):
    return "-" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def size_str(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f} {unit}"
    return f"{b} B"


def markdown(points, walls, head):
    algos = [a for a in FORCED + ["auto"] if any(a in p["algos"] for p in points)]
    L = [f"# Host allreduce algorithms over delayed, shaped links ({head['date']})", "",
         f"- binary: {head['git']}", f"- command: `{head['cmdline']}`",
         f"- machine: {head['cores']} cores. Times: µs per call, median over repetitions [min–max]; one "
         "sample = one run (mean over its calls, slowest rank, out-of-place).",
         "- CPU kept out: each algorithm is also run with no qdisc at all (same world, sizes, "
         "repetitions): the CPU floor (`floor`, of auto's choice). More processes than cores measure the "
         "scheduler, not the network: flag `cpu` where an algorithm's floor is > 20% of its time here "
         "(shown on auto's cell and on `best`). Processes are pinned to core (host mod cores) unless --pin 0.",
         "- auto: the default, the links measured when each communicator is made (LOWRANK_UCX_PROBE) "
         "and the cost model's choice with them; `choice` is what the transport reported it ran "
         "(lowrankCommGetTransportInfo); the heading gives the constants it measured (median over "
         "runs). `>10%`: auto/best > 1.10; `bytes`: auto sends > 1.1x the ring's bytes and is slower "
         "than the ring (the 95% interval of auto/ring, paired by repetition, above 1).", ""]
    for key in sorted({(p["world"], p["rate"], p["delay"]) for p in points}):
        ps = [p for p in points if (p["world"], p["rate"], p["delay"]) == key]
        m = ps[0].get("measured")
        consts = (f"measured: alpha {m['alpha_us']:.1f} µs, o {m['overhead_us']:.2f} µs, beta "
                  f"{m['beta_ns_per_byte']:.3f} ns/B"
                  + (f"; the probe took {1e3 * m['probe_seconds_median']:.0f} ms (median; max "
                     f"{1e3 * m['probe_seconds_max']:.0f})" if "probe_seconds_max" in m else "")
                  if m else
                  f"alpha {ps[0]['alpha_us']:g} µs, beta {ps[0]['beta_ns']:g} ns/B")
        L += [f"## {key[0]} hosts, {key[1]}, one-way delay {key[2]} ({consts})", "",
              "| size | " + " | ".join(SHORT[a] for a in algos) + " | choice | best | auto/best | floor | bytes auto/ring | flags |",
              "|---:|" + "---:|" * len(algos) + "---|---|---:|---:|---:|---|"]
        for p in ps:
            al = p["algos"]
            cells = []
            for a in algos:
                v = al.get(a)
                cells.append("-" if not v else f"{us(v['median'])} [{us(v['min'])}–{us(v['max'])}]"
                             + (" cpu" if v["cpu_flag"] else "") + (" WRONG" if v["nwrong"] else ""))
            au, ring, best = al.get("auto"), al.get("ring"), p.get("best")
            flags = [f for f, on in ((">10%", p.get("auto_over_best", 0) > 1.10), ("bytes", p.get("bytes_flag")),
                                     ("cpu(best)", best and al[best]["cpu_flag"])) if on]
            choice = SHORT[p["model_choice"]] + {True: "", False: " ≠best", None: " (not run)"}[p.get("picked_best")]
            ratio = f"{p['auto_over_best']:.2f}" if "auto_over_best" in p else "-"
            nbytes = f"{au['bytes'] / ring['bytes']:.2f}" if au and ring and ring["bytes"] else "-"
            L.append(f"| {size_str(p['size'])} | " + " | ".join(cells) + f" | {choice} | {SHORT.get(best, '-')} | "
                     f"{ratio} | {us(au['floor_us']) if au else '-'} | {nbytes}")
            L[-1] += f" | {' '.join(flags)} |"
        L.append("")
    L += ["## Targets", ""] + [f"- {t}" for t in head["targets"]]
    tw = sum(w["wall_s"] for w in walls)
    L += ["", f"Wall time of the runs: {tw:,.0f} s over {len(walls)} runs (each: startup + warm-up + "
          "out-of-place and in-place calls at every size of its group)."]
    return "\n".join(L) + "\n"


def targets(points):
    t = []
    ab = [p for p in points if "auto_over_best" in p]
    if ab:
        worst = max(ab, key=lambda p: p["auto_over_best"])
        bad = [p for p in ab if p["auto_over_best"] > 1.10]
        t.append(f"auto within 10% of the best measured at every point: {'yes' if not bad else 'NO'} "
                 f"({len(bad)} of {len(ab)} points above 1.10; worst {worst['auto_over_best']:.2f} at "
                 f"{worst['world']} hosts, {worst['rate']}, {worst['delay']}, {size_str(worst['size'])}); "
                 f"auto's model choice = best measured at {sum(p.get('picked_best') is True for p in ab)} of {len(ab)}")
    judged = [p for p in ab if p["world"] == 16 and p["delay"] in ("1ms", "1.0ms", "1000us")]
    if judged:
        bad = [p for p in judged if p["auto_over_best"] > 1.10]
        t.append(f"judged (16 hosts, 1 ms): auto within 1.1x of the best at every point: "
                 f"{'met' if not bad else 'NOT met'} ({len(bad)} of {len(judged)} above)" +
                 "".join(f"; {p['rate']} {size_str(p['size'])} {p['auto_over_best']:.2f}" for p in bad))
    else:
        t.append("judged (16 hosts, 1 ms): not in this sweep")
    tp = [p for p in points if p["world"] == 16 and p["delay"] in ("1ms", "1.0ms", "1000us")
          and p["size"] == 16384 and p["rate"] == "100mbit" and "direct_over_auto" in p]
    t += [f"16 hosts, 100 Mbit/s, 1 ms, 16 KiB: direct / auto = {p['direct_over_auto']:.2f} "
          f"(target >= 1.8): {'met' if p['direct_over_auto'] >= 1.8 else 'NOT met'}" for p in tp] or \
         ["16 hosts, 100 Mbit/s, 1 ms, 16 KiB: not in this sweep"]
    bf = [p for p in points if p.get("bytes_flag")]
    t.append(f"points where auto sends > 1.1x the ring's bytes while slower: {len(bf)}" +
             "".join(f"; {p['world']} hosts {p['rate']} {p['delay']} {size_str(p['size'])}" for p in bf))
    cpu = [p for p in points if "auto" in p["algos"] and p["algos"]["auto"]["cpu_flag"]]
    t.append(f"points where the CPU floor of auto's choice is > 20% of auto's time: {len(cpu)} of {len(points)}")
    wrong = [p for p in points if any(v["nwrong"] for v in p["algos"].values())]
    t.append(f"points with wrong elements: {len(wrong)}")
    return t


def source_label(name, report):
    """How a figure's caption names a report (its "git" and "provenance" as algorithms_report
    writes them): 'NAME (revision R, library sha256 S)', S's first 12 digits, where recorded."""
    rev = (str(report.get("git") or "").split() or ["?"])[0]
    sha = provenance.library_sha256(report)
    return f"{name} (revision {rev}" + (f", library sha256 {sha[:12]}" if sha != "unrecorded" else "") + ")"


def figure(points, out, caption=None):
    """OUT.png: a panel per (hosts, rate, delay), µs per call against bytes, each algorithm forced
    and auto (dashed); `caption` (where the points came from) under the panels. None without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    keys = sorted({(p["world"], p["rate"], p["delay"]) for p in points})
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 3 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        ps = [p for p in points if (p["world"], p["rate"], p["delay"]) == key]
        for a in FORCED + ["auto"]:
            xs = [p["size"] for p in ps if a in p["algos"]]
            if xs:
                ax.plot(xs, [p["algos"][a]["median"] for p in ps if a in p["algos"]], "o-" if a != "auto" else "k--",
                        label=a)
        ax.set(xscale="log", yscale="log", xlabel="bytes", ylabel="µs per call",
               title=f"{key[0]} hosts, {key[1]}, {key[2]} one way")
        ax.legend(fontsize=7)
    if caption:
        fig.text(0.01, 0.002, caption, fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.03 if caption else 0, 1, 1))
    fig.savefig(out + ".png", dpi=90)
    return out + ".png"


def parse_args(argv=None):
    """The positional arguments algorithms.sh passes; argparse's usage and exit 2 otherwise."""
    ap = argparse.ArgumentParser(prog="python -m studies.netns.algorithms_report",
                                 description="The report of studies/netns/algorithms.sh (run by it).")
    ap.add_argument("runs", metavar="RUNS", help="the runs' list (one line a run, see the module's doc)")
    ap.add_argument("out", metavar="OUT", help="writes OUT.json, OUT.md (and OUT.png with matplotlib)")
    ap.add_argument("model", metavar="MODEL", help="the lowrank_cost_model binary")
    ap.add_argument("cores", metavar="CORES", type=int, help="the machine's CPU cores")
    ap.add_argument("git", metavar="GIT", help="the commit the runs used")
    ap.add_argument("cmdline", metavar="CMDLINE", help="algorithms.sh's command line")
    ap.add_argument("date", metavar="DATE", help="the runs' date")
    ap.add_argument("provenance", metavar="PROVENANCE", nargs="?",
                    help="the runs' start record (python -m studies.lib.provenance start)")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    runs, out, model = args.runs, args.out, args.model
    samples, meta, walls, transport = load(runs)
    points = analyse(samples, meta, model, transport)
    head = dict(date=args.date, git=args.git, cmdline=args.cmdline, cores=args.cores,
                targets=targets(points))
    if args.provenance:
        head["provenance"] = provenance.finish(json.load(open(args.provenance)))
    fig = figure(points, out, caption=source_label(os.path.basename(out) + ".json", head))
    json.dump(dict(head, figure=fig, points=points, runs=walls), open(out + ".json", "w"), indent=1)
    md = markdown(points, walls, head)
    if fig is None:
        md += "\nNo figure: matplotlib is not importable by this Python.\n"
    open(out + ".md", "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
