#!/usr/bin/python3
"""The report of studies/netns/bench.sh: speedups, bounds, the link check; JSON and markdown.

usage: python -m studies.netns.report runs RUNS_FILE OUT HOSTS DATE CORES GIT GRADIENTS [PROVENANCE]
                                                                     (from bench.sh)
       python -m studies.netns.report json OLD.json OUT                (recompute a saved run)
PROVENANCE: the start record of the runs (python -m studies.lib.provenance start), finished here
and kept in OUT.json as "provenance" (studies/lib/provenance.py).
RUNS_FILE lines: RATE BITS KIND PIPELINE RANK0_JSON. Writes OUT.json and OUT.md; exit status 1 when a
link was bypassed (exact busbw above the link rate).

Per row: speedup = exact time / time (same rate); the bound on it
  bound = exact time / max(compute floor, compressed wire time)
  compressed wire time = 2 (N-1)/N * payload bytes / link rate (payload: P, Q, the exact part and
    the flag, float32; fp16 rows: the half buffer)
  compute floor = bytes the compression must move / the triad bandwidth of one host while all N
    hosts run it at once ("shared cores": the perf binary's bound_us). The triad is measured by every
    perf run; a run disturbed by other work on the machine would move the floor, so the floor uses
    the median triad over all runs of the report (bound_us * triad_shared / median triad_shared).
  bound (own cores) = the same with each host's triad alone (bound_alone_us, median triad alone).
Link check: exact mode's busbw against the link's TCP goodput, rate * 1448/1514 (1500-byte MTU, TCP
timestamps: 66 bytes of Ethernet, IP and TCP headers per 1448 bytes of data, all counted by tbf).
Within 10% (0.9 .. 1.1): ok. Above: the links were bypassed (the numbers are void). Below: this
machine cannot drive the link (CPU-bound), the rate is not what limits exact mode.
Hidden fraction (pipelined rows): (compute + comm - time) / min(compute, comm).
"""
import json
import statistics
import sys

from studies.lib import provenance

GOODPUT = 1448 / 1514


def load_runs(runs):
    rows = []
    for line in open(runs):
        rate, bits, kind, pipe, path = line.split()
        d = json.load(open(path))
        for r in d["results"]:
            l = r["lowrank"]
            rows.append(dict(rate=rate, bits=int(bits), mode=l["mode"], k=l["k"],
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


def analyse(rows, n):
    ring = 2 * (n - 1) / n
    shared = [r["triad_shared_gbps"] for r in rows if r.get("triad_shared_gbps")]
    alone = [r["triad_gbps"] for r in rows if r.get("triad_gbps")]
    med_shared = statistics.median(shared) if shared else None
    med_alone = statistics.median(alone) if alone else None
    exact = {r["rate"]: r for r in rows if r["mode"] == "exact"}
    status = 0
    for r in rows:
        ex = exact.get(r["rate"])
        rate_Bps = r["bits"] / 8
        if r["mode"] == "exact":
            r["wire_us"] = ring * r["size"] / rate_Bps * 1e6
            link = rate_Bps / 1e9
            r["busbw_of_rate"] = r["busbw"] / link
            r["busbw_of_goodput"] = r["busbw"] / (link * GOODPUT)
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
    md = [f"# netns benchmark: {n} hosts (network namespaces, tbf-shaped veth links), one process each",
          "", f"- {meta['date']}, {meta['cores']} cores shared by the {n} hosts; lowrank {meta['lowrank']}",
          f"- gradients {meta['gradients']} (ResNet-50 shapes, 25.6 M float32, synthetic, decaying spectrum)",
          f"- triad (median over the runs): {f(med_alone, '{:.2f}')} GB/s for one host alone, "
          f"{f(med_shared, '{:.2f}')} GB/s per host with all {n} at once", "",
          "| rate | mode | k | pipeline | ms/call | speedup over exact | bound (shared cores) | of bound | "
          "bound (own cores) | compute ms | comm ms | hidden | comm/compute | wire ms (ideal) | busbw GB/s | relerr |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['rate']} | {r['mode']} | {r['k']} | {f(r['pipeline'], '{}')} | {r['time_us']/1e3:.1f} | "
                  f"{f(r.get('speedup'), '{:.2f}x')} | {f(r.get('bound'), '{:.2f}x')} | "
                  f"{f(r.get('of_bound'), '{:.2f}')} | {f(r.get('bound_own'), '{:.2f}x')} | "
                  f"{f(ms(r.get('compute_us')))} | {f(ms(r.get('comm_us')))} | {f(r.get('hidden'), '{:.2f}')} | "
                  f"{f(r.get('comm_over_compute'), '{:.2f}')} | {r['wire_us']/1e3:.1f} | {r['busbw']:.3f} | "
                  f"{f(r['relerr'], '{:.4f}')} |")
    md.append("")
    for r in rows:
        if r["mode"] == "exact":
            md.append(f"- {r['rate']}: {r['check']}")
    return "\n".join(md) + "\n"


def main():
    if len(sys.argv) >= 9 and sys.argv[1] == "runs":
        runs, out, n, date, cores, git, gdir = sys.argv[2:9]
        meta = dict(date=date, cores=int(cores), hosts=int(n), lowrank=git, gradients=gdir)
        if len(sys.argv) > 9:
            meta["provenance"] = provenance.finish(json.load(open(sys.argv[9])))
        rows = load_runs(runs)
    elif len(sys.argv) == 4 and sys.argv[1] == "json":
        old = json.load(open(sys.argv[2]))
        out = sys.argv[3]
        meta = {k: old[k] for k in ("date", "cores", "hosts", "lowrank", "gradients", "provenance") if k in old}
        rows = old["rows"]
    else:
        sys.exit(__doc__)
    status, med_shared, med_alone = analyse(rows, meta["hosts"])
    for r in rows:
        if r["mode"] == "exact":
            print(f"# CHECK {r['rate']}: {r['check']}", file=sys.stderr if not r["check"].startswith("ok") else sys.stdout)
    json.dump(dict(meta, triad_median_gbps=med_alone, triad_shared_median_gbps=med_shared, rows=rows),
              open(out + ".json", "w"), indent=1)
    text = markdown(meta, rows, med_shared, med_alone)
    open(out + ".md", "w").write(text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
