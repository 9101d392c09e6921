#!/usr/bin/env python3
"""The verdicts of a paired-arms plan: plan_alternate.toml (issue 44: alternating PowerSGD against
PowerSGD at k = 2) or plan_bf16.toml (issue 45: bf16 factors against fp32 factors), from the runs
studies.accuracy.run --plan alternate|bf16 wrote: per model and arm the paired differences per
seed against the plan's reference, one-sided 95% t bounds (studies/lib/stats.py), and the plan's
rule ([rule]): non-inferior / inferior / undecided.

  /usr/bin/python3 -m studies.accuracy.report_alternate [--plan bf16] [--results DIR]

Reads DIR/runs/*.json (default: the plan's `results`), each checked by studies/lib/provenance.py
(the plan has no exceptions: a run whose library was not built from its revision is refused);
writes DIR/summary.{json,md}: the verdicts, every run's final metric per seed, the spreads, the bits
per worker each arm measured, and the provenance of the runs (the library's path and sha256, the
revision, the workers' Python and torch).
"""
import argparse
import glob
import json
import os
import statistics
import sys

from studies.accuracy import report as accuracy_report
from studies.lib import plan as planfile
from studies.lib import provenance, runlabel, stats
from studies.lib.launch import ROOT

PLANS = {"alternate": "plan_alternate.toml", "bf16": "plan_bf16.toml"}  # --plan
PLAN_FILE = PLANS["alternate"]
PLAN = planfile.load(__file__, PLAN_FILE)
RULE = PLAN["rule"]
RESULTS = os.path.join(ROOT, PLAN["results"])  # --results
METRIC = {"cnn": "test_accuracy", "transformer": "test_loss"}


def use_plan(which):
    """Read the plan `which` (a key of PLANS) for what follows; returns its results folder."""
    global PLAN_FILE, PLAN, RULE, RESULTS
    PLAN_FILE = PLANS[which]
    PLAN = planfile.load(__file__, PLAN_FILE)
    RULE = PLAN["rule"]
    RESULTS = os.path.join(ROOT, PLAN["results"])
    return RESULTS


def arm_label(arm):
    """"lowrank-alternate k=2" of a plan's [label, k]."""
    return f"{arm[0]} k={arm[1]}"


def worse_by(model, reference, arm):
    """How much worse `arm`'s final metric is than the reference's (the plan's d_s): CNN accuracy
    reference - arm, transformer loss arm - reference. Positive: the arm is worse."""
    return reference - arm if model == "cnn" else arm - reference


def decide(d, delta, alpha=RULE["alpha"]):
    """The plan's rule on the paired differences d (one per seed, how much worse the arm is) and
    margin delta: D = mean d, SE = sd(d) / sqrt(n), t = t_quantile(1 - alpha, n - 1), U = D + t SE,
    L = D - t SE; "non-inferior" when U < delta, "inferior" when L > delta, else "undecided".
    Fewer than 2 seeds: "undecided" with no bounds (no SE). `facts`: "worse (L > 0)" or
    "better (U < 0)", said beside the verdict, not a verdict."""
    d = [float(x) for x in d]
    n = len(d)
    out = dict(n=n, delta=delta, alpha=alpha, d=d, D=statistics.fmean(d) if d else None,
               sd=None, se=None, t=None, L=None, U=None, facts=[])
    if n < 2:
        out.update(verdict="undecided", why=f"{n} seed{'s' if n != 1 else ''} complete in every arm: "
                                            "no standard error, no bound")
        return out
    m = stats.mean_se(d)
    t = stats.t_quantile(1.0 - alpha, n - 1)
    low, up = m.mean - t * m.se, m.mean + t * m.se
    out.update(D=m.mean, sd=m.sd, se=m.se, t=t, L=low, U=up)
    if up < delta:
        out["verdict"], out["why"] = "non-inferior", f"U = {up:.4g} < delta = {delta:g}"
    elif low > delta:
        out["verdict"], out["why"] = "inferior", f"L = {low:.4g} > delta = {delta:g}"
    else:
        out["verdict"], out["why"] = "undecided", f"L = {low:.4g} <= delta = {delta:g} <= U = {up:.4g}"
    if low > 0:
        out["facts"].append("worse than the reference (L > 0)"
                            + (", within the margin" if out["verdict"] == "non-inferior" else ""))
    if up < 0:
        out["facts"].append("better than the reference (U < 0)")
    return out


def load_runs(results):
    """{(model, label, k): {seed: run JSON}} of results/runs/*.json, each checked by provenance."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "runs", "*.json"))):
        with open(path) as f:
            d = json.load(f)
        provenance.check_run(d, PLAN, path)
        c = d["config"]
        label = runlabel.reducer(c)
        k = c["rank"] if runlabel.has_rank(label) else None
        d["_file"] = os.path.relpath(path, ROOT)
        runs.setdefault((c["model"], label, k), {})[c["seed"]] = d
    return runs


def _mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def summarize(runs):
    """(arms, tests, provenance) of the runs, per the plan."""
    arms, tests = [], []
    reference = tuple(PLAN["reference"])
    planned_arms = [tuple(a) for a in PLAN["arms"]]
    for model in PLAN["models"]:
        planned = list(range(PLAN["seeds"][model]))
        have = {a: runs.get((model, *a), {}) for a in planned_arms}
        for a in planned_arms:
            ds = have[a]
            values = {s: accuracy_report.final_metric(ds[s]) for s in planned if s in ds}
            mean, sd = _mean_sd(values.values())
            bits, _ = _mean_sd([ds[s]["epochs"][-1]["bits_cumulative"] for s in values])
            bits_after, _ = _mean_sd([ds[s].get("bits_after_warmup") for s in values])
            ms, _ = _mean_sd([accuracy_report.steady_ms(ds[s]) for s in values])
            payload = sorted({(ds[s].get("lowrank_stats") or {}).get("payloadElements") for s in values},
                             key=lambda x: (x is None, x))
            extra = sorted(s for s in ds if s not in planned)
            arms.append(dict(model=model, arm=list(a), label=arm_label(a), metric=METRIC[model],
                             seeds=sorted(values), values={str(s): v for s, v in sorted(values.items())},
                             mean=mean, sd=sd, bits_per_worker=bits, bits_after_warmup=bits_after,
                             payload_elements=payload,
                             batch_ms=ms, seeds_beyond_plan_ignored=extra))
        complete = [s for s in planned if all(s in have[a] for a in planned_arms)]
        missing = {s: [arm_label(a) for a in planned_arms if s not in have[a]]
                   for s in planned if s not in complete}
        delta = RULE[f"delta_{model}"]
        for a in planned_arms:
            if a == reference:
                continue
            ref = {s: accuracy_report.final_metric(have[reference][s]) for s in complete}
            arm = {s: accuracy_report.final_metric(have[a][s]) for s in complete}
            d = [worse_by(model, ref[s], arm[s]) for s in complete]
            t = decide(d, delta)
            t.update(model=model, arm=list(a), label=arm_label(a), reference=arm_label(reference),
                     seeds=complete, planned_seeds=len(planned),
                     left_out={str(s): m for s, m in missing.items()},
                     per_seed=[dict(seed=s, reference=ref[s], arm=arm[s], d=dd)
                               for s, dd in zip(complete, d)])
            tests.append(t)
    return arms, tests, run_provenance(runs)


def run_provenance(runs):
    """What made the runs: per run its library (path, sha256), revision, Python and torch; and the
    distinct values over all runs (one build for every arm is the plan's)."""
    rows = []
    for (model, label, k), by_seed in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        for s, d in sorted(by_seed.items()):
            rec = d.get("provenance") or {}
            lib = rec.get("library") or {}
            env = (d.get("machine") or {}).get("env") or {}
            rows.append(dict(file=d["_file"], model=model, arm=label, k=k, seed=s,
                             revision=rec.get("revision"), describe=rec.get("describe"),
                             library=lib.get("library"), library_sha256=provenance.library_sha256(d),
                             library_revision=lib.get("revision"), sources_digest=lib.get("sources_digest"),
                             LOWRANK_LIBRARY=env.get("LOWRANK_LIBRARY"),
                             python=(d.get("machine") or {}).get("executable"), torch=rec.get("torch"),
                             started_utc=rec.get("started_utc"), ended_utc=rec.get("ended_utc")))
    distinct = {key: sorted({str(r[key]) for r in rows})
                for key in ("library", "library_sha256", "LOWRANK_LIBRARY", "revision", "sources_digest",
                            "python", "torch")}
    return dict(runs=rows, distinct=distinct)


def _fmt(model, x, signed=False):
    """A metric or difference in the model's unit: CNN accuracy points, transformer nats."""
    if x is None:
        return "—"
    return (f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}") if model == "cnn" else \
        (f"{x:+.4f}" if signed else f"{x:.4f}")


def write_summary(results, arms, tests, prov):
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(dict(plan="studies/accuracy/" + PLAN_FILE, rule=dict(RULE), arms=arms, tests=tests,
                       provenance=prov, report_revision=provenance.revision()), f, indent=1)
    rel = os.path.relpath(results, ROOT)
    n_tests = len(PLAN["models"]) * (len(PLAN["arms"]) - 1)
    lines = [f"# {PLAN['title']}: accuracy", "",
             f"Written by studies/accuracy/report_alternate.py from {rel}/runs/*.json, the plan "
             f"studies/accuracy/{PLAN_FILE} (fixed before the runs). d per seed: how much worse "
             "the arm is than the reference (CNN: the reference's final test accuracy minus the arm's, "
             "in points; transformer: the arm's final test loss minus the reference's, in nats). "
             f"[L, U]: one-sided {100 * (1 - RULE['alpha']):g}% bounds D ∓ t(0.95, n - 1) SE. "
             f"non-inferior: U < delta; inferior: L > delta; undecided otherwise. {n_tests} tests, each at "
             "its own one-sided 5%; no claim combines them.", "",
             "## Verdicts", "",
             "| model | arm vs reference | n (planned) | D | L | U | delta | verdict | beside it |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in tests:
        m = t["model"]
        lines.append(f"| {m} | {t['label']} vs {t['reference']} | {t['n']} ({t['planned_seeds']}) | "
                     f"{_fmt(m, t['D'], True)} | {_fmt(m, t['L'], True)} | {_fmt(m, t['U'], True)} | "
                     f"{_fmt(m, t['delta'])} | **{t['verdict']}** | {'; '.join(t['facts']) or '—'} |")
    notes = [f"- {t['model']}, {t['label']}: seeds left out (an arm missing after the rerun): "
             + ", ".join(f"{s} ({', '.join(a)})" for s, a in t["left_out"].items())
             for t in tests if t["left_out"]]
    lines += [""] + (notes or [f"Every planned seed is complete in all {len(PLAN['arms'])} arms."])
    lines += ["", "Units: CNN in accuracy points (0.50 = half a point; 1 test image = 0.28), transformer "
              "in nats per character.", "", "## Per seed", ""]
    for t in tests:
        m = t["model"]
        lines += [f"{m}, {t['label']} vs {t['reference']} (sd of d {_fmt(m, t['sd'])}, SE {_fmt(m, t['se'])}"
                  + (f", t {t['t']:.3f}" if t["t"] is not None else "") + "):", "",
                  "| seed | reference | arm | d |", "|---|---|---|---|"]
        lines += [f"| {p['seed']} | {_fmt(m, p['reference'])} | {_fmt(m, p['arm'])} | {_fmt(m, p['d'], True)} |"
                  for p in t["per_seed"]]
        lines.append("")
    lines += ["## Arms", "",
              "Final metric per seed (CNN test accuracy %, transformer test loss), its mean and sd over "
              "the seeds; payload: the elements each worker handed to the transport over the run "
              "(lowrank's payloadElements: exact part and factors; the seeds' distinct values); bits "
              "per worker over the whole run (lowrank's bytesSent, mean over seeds) and from the first "
              "compressed step on; ms per batch (epochs 2.., 16 workers sharing the host's cores). "
              "bytesSent depends on the allreduce algorithm the host transport's cost model picks per "
              "run (docs/training.md: a latency-bound one sends several times the payload), so it "
              "varies between seeds of one arm; the payload does not.", "",
              "| model | arm | seeds | values | mean | sd | payload elements | bits per worker | after warm-up | ms/batch |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for a in arms:
        m = a["model"]
        vals = ", ".join(f"{s}: {_fmt(m, v)}" for s, v in a["values"].items())
        g = (lambda x: f"{x:.4g}" if x is not None else "—")
        lines.append(f"| {m} | {a['label']} | {len(a['seeds'])} | {vals} | {_fmt(m, a['mean'])} | "
                     f"{_fmt(m, a['sd'])} | {', '.join(g(x) for x in a['payload_elements'])} | "
                     f"{g(a['bits_per_worker'])} | {g(a['bits_after_warmup'])} | "
                     f"{g(a['batch_ms'])} |")
    ignored = [f"{a['model']} {a['label']}: {a['seeds_beyond_plan_ignored']}" for a in arms
               if a["seeds_beyond_plan_ignored"]]
    if ignored:
        lines += ["", "Seeds beyond the plan, ignored: " + "; ".join(ignored)]
    lines += ["", "## Provenance", "",
              f"{len(prov['runs'])} runs (every one passed studies/lib/provenance.py's check_run: its "
              "library was built from its revision's sources). Distinct over the runs:", ""]
    lines += [f"- {k}: {', '.join(v)}" for k, v in prov["distinct"].items()]
    lines += ["", "Per run: summary.json's provenance.runs (file, revision, library path and sha256, "
              "started and ended)."]
    with open(os.path.join(results, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def report(results=RESULTS):
    """Summary of the runs under results/runs; returns (arms, tests, provenance)."""
    results = os.path.abspath(results)
    arms, tests, prov = summarize(load_runs(results))
    write_summary(results, arms, tests, prov)
    return arms, tests, prov


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", choices=sorted(PLANS), default="alternate")
    ap.add_argument("--results", help="folder of runs/ and the summary (default: the plan's)")
    args = ap.parse_args()
    results = use_plan(args.plan)
    args.results = args.results or results
    if not glob.glob(os.path.join(args.results, "runs", "*.json")):
        sys.exit(f"studies.accuracy.report_alternate: no runs ({args.results}/runs/*.json)")
    report(args.results)


if __name__ == "__main__":
    main()
