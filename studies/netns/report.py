#!/usr/bin/python3
"""The report of studies/netns/bench.sh: speedups, bounds, the link check; JSON and markdown.

usage: python -m studies.netns.report runs RUNS_FILE OUT HOSTS DATE CORES GIT GRADIENTS [PROVENANCE]
                                             [--delay D] [--link KIND]      (from bench.sh)
       python -m studies.netns.report json OLD.json OUT                (recompute a saved run)
PROVENANCE: the start record of the runs (python -m studies.lib.provenance start), finished here
and kept in OUT.json as "provenance" (studies/lib/provenance.py). --delay: the links' one-way delay
as set (e.g. 250us), --link: their kind (netns_hosts.sh's hosts_link); both go into the header.
RUNS_FILE lines: RATE BITS KIND PIPELINE RANK0_JSON [ALGO [RANK0_OUT]]: ALGO "chosen" (the host
allreduce as the library chooses it: LOWRANK_UCX_ALGO unset, the links probed) or the algorithm
forced by LOWRANK_UCX_ALGO (e.g. ring); RANK0_OUT: rank 0's stdout, whose "# transport" lines
(lowrankCommGetTransportInfo) are kept in the row as "transport" and give the exact rows'
"algorithm" (the one used for the row's size class). Writes OUT.json and OUT.md; exit status 1
when a link was bypassed (exact busbw above the link rate).

The baseline of a rate is its fastest exact row (bench.sh runs exact twice: as chosen and with the
ring forced, so that no speedup is taken over a slow choice); JSON: "baseline": true on it.
Per row: speedup = baseline time / time (same rate; the other exact row too); the bound on it
  bound = exact time / max(compute floor, compressed wire time)   (exact: the baseline)
  compressed wire time = 2 (N-1)/N * payload bytes / link rate (payload: P, Q, the exact part and
    the flag, float32; fp16 rows: the half buffer)
  compute floor = bytes the compression must move / the triad bandwidth of one host while all N
    hosts run it at once ("shared cores": the perf binary's bound_us). The triad is measured by every
    perf run; a run disturbed by other work on the machine would move the floor, so the floor uses
    the median triad over all runs of the report (bound_us * triad_shared / median triad_shared).
  bound (own cores) = the same with each host's triad alone (bound_alone_us, median triad alone).
Link check (the baseline): exact mode's busbw against the link's TCP goodput, rate * 1448/1514
(1500-byte MTU, TCP timestamps: 66 bytes of Ethernet, IP and TCP headers per 1448 bytes of data,
all counted by the link's pacing). Within 10% (0.9 .. 1.1): ok. Above: the links were bypassed
(the numbers are void). Below: this machine cannot drive the link (CPU-bound), the rate is not
what limits exact mode.
Hidden fraction (pipelined rows): (compute + comm - time) / min(compute, comm).
"""
import argparse
import json
import re
import statistics
import sys

from studies.lib import provenance
from studies.netns.algorithms_report import reported_choice

GOODPUT = 1448 / 1514
# what analyse() computes; dropped first, so that a recomputed report keeps nothing stale
DERIVED = ("wire_us", "busbw_of_rate", "busbw_of_goodput", "check", "baseline", "floor_us",
           "floor_own_us", "speedup", "bound", "bound_own", "of_bound", "hidden", "comm_over_compute")
TRANSPORT_LINE = re.compile(r"^# transport \((\w+) comm, comm rank 0\): (\{.*\})$")


def transport_infos(out_path):
    """{comm name: lowrankCommGetTransportInfo's object} from the perf binary's "# transport" lines."""
    infos = {}
    for line in open(out_path, errors="replace"):
        m = TRANSPORT_LINE.match(line.rstrip("\n"))
        if m:
            infos[m.group(1)] = json.loads(m.group(2))
    return infos


def load_runs(runs):
    rows = []
    for line in open(runs):
        rate, bits, kind, pipe, path, *rest = line.split()
        algo = rest[0] if rest else None
        transport = transport_infos(rest[1]) if len(rest) > 1 else {}
        d = json.load(open(path))
        for r in d["results"]:
            l = r["lowrank"]
            comm = transport.get("powersgd" if l["mode"] == "powersgd" else "exact")
            rows.append(dict(rate=rate, bits=int(bits), mode=l["mode"], k=l["k"], algo=algo,
                             transport=comm,
                             algorithm=(reported_choice([comm], r["size"])
                                        if comm and l["mode"] == "exact" else None),
                             pipeline=None if pipe == "-" else int(pipe),
                             time_us=r["out_of_place"]["time"], in_place_us=r["in_place"]["time"],
                             busbw=r["out_of_place"]["bus_bw"], size=r["size"], relerr=l["relerr"],
                             cumrelerr=l.get("cumrelerr"), ratio=l["ratio"],
                             wire_bytes=l.get("wire_bytes"),
                             compute_us=l.get("compute_us"), comm_us=l.get("comm_us"),
                             bound_us=l.get("bound_us"), bound_alone_us=l.get("bound_alone_us"),
                             p=l.get("p_elements"), q=l.get("q_elements"), e=l.get("exact_elements"),
                             triad_gbps=d.get("triad_gbps"),
                             triad_shared_gbps=d.get("triad_shared_gbps"),
                             command_line=d.get("command_line")))
    return rows


def baselines(rows):
    """{rate: its fastest exact row}: the exact allreduce to beat (as chosen or the ring forced)."""
    best = {}
    for r in rows:
        if r["mode"] == "exact" and (r["rate"] not in best or r["time_us"] < best[r["rate"]]["time_us"]):
            best[r["rate"]] = r
    return best


def exact_label(r):
    """An exact row's mode with how its allreduce was chosen: "exact (as chosen: ring)", "exact
    (ring forced)"; other rows (and runs without the record): the mode."""
    if r["mode"] != "exact" or not r.get("algo"):
        return r["mode"]
    if r["algo"] == "chosen":
        return f"{r['mode']} (as chosen: {r.get('algorithm') or '?'})"
    return f"{r['mode']} ({r['algo']} forced)"


def analyse(rows, n):
    for r in rows:
        for key in DERIVED:
            r.pop(key, None)
    ring = 2 * (n - 1) / n
    shared = [r["triad_shared_gbps"] for r in rows if r.get("triad_shared_gbps")]
    alone = [r["triad_gbps"] for r in rows if r.get("triad_gbps")]
    med_shared = statistics.median(shared) if shared else None
    med_alone = statistics.median(alone) if alone else None
    exact = baselines(rows)
    status = 0
    for r in rows:
        ex = exact.get(r["rate"])
        rate_Bps = r["bits"] / 8
        if r["mode"] == "exact":
            r["wire_us"] = ring * r["size"] / rate_Bps * 1e6
            link = rate_Bps / 1e9
            r["busbw_of_rate"] = r["busbw"] / link
            r["busbw_of_goodput"] = r["busbw"] / (link * GOODPUT)
            r["baseline"] = r is ex
            if r is not ex:
                r["speedup"] = ex["time_us"] / r["time_us"]
                continue
            g = r["busbw_of_goodput"]
            what = (f"exact busbw {r['busbw']:.4f} GB/s = {r['busbw_of_rate']:.2f} x the link rate "
                    f"{link:.4f} GB/s, {g:.2f} x its TCP goodput")
            if g > 1.1:
                r["check"] = f"LINKS BYPASSED: {what}: the shaping did not hold, these numbers are void"
                status = 1
            elif g < 0.9:
                r["check"] = (f"LINK NOT FILLED: {what}: this machine cannot drive the link (CPU-bound), "
                              "the rate is not what limits exact mode here")
            else:
                r["check"] = f"ok (link-bound): {what}"
        elif r["mode"] == "fp16":
            r["wire_us"] = ring * r["size"] / 2 / rate_Bps * 1e6
        else:
            payload = 4 * ((r["p"] or 0) + (r["e"] or 0) + 1 + (r["q"] or 0))
            r["wire_us"] = ring * payload / rate_Bps * 1e6
        if r.get("bound_us") and r.get("triad_shared_gbps") and med_shared:
            r["floor_us"] = r["bound_us"] * r["triad_shared_gbps"] / med_shared
        if r.get("bound_alone_us") and r.get("triad_gbps") and med_alone:
            r["floor_own_us"] = r["bound_alone_us"] * r["triad_gbps"] / med_alone
        if ex and r["mode"] != "exact":
            r["speedup"] = ex["time_us"] / r["time_us"]
            r["bound"] = ex["time_us"] / max(r.get("floor_us") or 0, r["wire_us"])
            r["bound_own"] = ex["time_us"] / max(r.get("floor_own_us") or 0, r["wire_us"])
            r["of_bound"] = r["speedup"] / r["bound"]
        c, m, t = r.get("compute_us"), r.get("comm_us"), r["time_us"]
        if r["mode"] == "powersgd" and c and m:
            r["hidden"] = (c + m - t) / min(c, m)
            r["comm_over_compute"] = m / c
    return status, med_shared, med_alone


def markdown(meta, rows, med_shared, med_alone):
    f = lambda v, s="{:.1f}": "-" if v is None else s.format(v)  # noqa: E731
    ms = lambda v: None if v is None else v / 1e3  # noqa: E731
    n = meta["hosts"]
    links = f"{meta['link']} links" if meta.get("link") else "tbf-shaped veth links"  # older runs: tbf
    delay = "" if meta.get("delay") is None else (", no delay" if meta["delay"] in ("0", "0us", "0ms")
                                                   else f", {meta['delay']} one way")
    md = [f"# netns benchmark: {n} hosts (network namespaces, {links}{delay}), one process each",
          "", f"- {meta['date']}, {meta['cores']} cores shared by the {n} hosts; lowrank {meta['lowrank']}",
          f"- gradients {meta['gradients']} (ResNet-50 shapes, 25.6 M float32, synthetic, decaying spectrum)",
          f"- triad (median over the runs): {f(med_alone, '{:.2f}')} GB/s for one host alone, "
          f"{f(med_shared, '{:.2f}')} GB/s per host with all {n} at once", "",
          "| rate | mode | k | pipeline | ms/call | speedup over the faster exact | bound (shared cores) | of bound | "
          "bound (own cores) | compute ms | comm ms | hidden | comm/compute | wire ms (ideal) | busbw GB/s | relerr |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = "baseline" if r.get("baseline") else f(r.get("speedup"), "{:.2f}x")
        md.append(f"| {r['rate']} | {exact_label(r)} | {r['k']} | "
                  f"{f(r['pipeline'], '{}')} | {r['time_us']/1e3:.1f} | "
                  f"{speedup} | {f(r.get('bound'), '{:.2f}x')} | "
                  f"{f(r.get('of_bound'), '{:.2f}')} | {f(r.get('bound_own'), '{:.2f}x')} | "
                  f"{f(ms(r.get('compute_us')))} | {f(ms(r.get('comm_us')))} | {f(r.get('hidden'), '{:.2f}')} | "
                  f"{f(r.get('comm_over_compute'), '{:.2f}')} | {r['wire_us']/1e3:.1f} | {r['busbw']:.3f} | "
                  f"{f(r['relerr'], '{:.4f}')} |")
    md.append("")
    for rate, b in baselines(rows).items():
        others = [r for r in rows if r["rate"] == rate and r["mode"] == "exact" and r is not b]
        md.append(f"- {rate}: baseline {exact_label(b)}, {b['time_us']/1e3:.1f} ms per call" + "".join(
            f"; {exact_label(r)} {r['time_us']/1e3:.1f} ms = {r['time_us']/b['time_us']:.3f} x it" for r in others))
        md.append(f"- {rate}: {b['check']}")
    return "\n".join(md) + "\n"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m studies.netns.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    runs = sub.add_parser("runs")
    for name in ("runs", "out", "hosts", "date", "cores", "git", "gradients"):
        runs.add_argument(name)
    runs.add_argument("provenance", nargs="?")
    runs.add_argument("--delay")
    runs.add_argument("--link")
    old = sub.add_parser("json")
    old.add_argument("old")
    old.add_argument("out")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.cmd == "runs":
        out = a.out
        meta = dict(date=a.date, cores=int(a.cores), hosts=int(a.hosts), lowrank=a.git,
                    gradients=a.gradients, delay=a.delay, link=a.link)
        if a.provenance:
            meta["provenance"] = provenance.finish(json.load(open(a.provenance)))
        rows = load_runs(a.runs)
    else:
        old = json.load(open(a.old))
        out = a.out
        keep = ("date", "cores", "hosts", "lowrank", "gradients", "delay", "link", "provenance")
        meta = {k: old[k] for k in keep if k in old}
        rows = old["rows"]
    status, med_shared, med_alone = analyse(rows, meta["hosts"])
    for r in rows:
        if r.get("check"):
            print(f"# CHECK {r['rate']}: {r['check']}", file=sys.stderr if not r["check"].startswith("ok") else sys.stdout)
    json.dump(dict(meta, triad_median_gbps=med_alone, triad_shared_median_gbps=med_shared, rows=rows),
              open(out + ".json", "w"), indent=1)
    text = markdown(meta, rows, med_shared, med_alone)
    open(out + ".md", "w").write(text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
