#!/usr/bin/env python3
"""The table of the time-per-batch setting (studies/time/run.py): per setting, rows Full
precision, Float16, Rank 1, 2, 4; columns PyTorch (DDP's allreduce, fp16_compress_hook,
powerSGD_hook chained bucket after bucket) and lowrank (lowrank-exact, -, lowrank's hook), `local`
beside; PyTorch's hook waited per bucket (torch-powersgd-waited, and every run written before the
chained hook existed: studies/lib/runlabel.py) in rows of its own, labelled.

Samples: the mean time per batch of each epoch but the first, of every repetition (an epoch's
mean is one sample: batches within an epoch are not independent, epochs nearly are). Each cell:
the mean over samples with its interval (Student's t), and the communication overhead = time
per batch - local's, with its interval (Welch's, exact fractional df); both at the plan's
confidence. Also the time per batch each hook spends
inside its call (on the autograd thread, so it delays backward) and the tail (from the last
bucket's hook call returning to backward's end: the reduction left once every gradient is
computed); together, the hook's time outside the backward computation.

  /usr/bin/python3 -m studies.time.report [--results studies/time/results]

Writes RESULTS/summary.json and .md; prints the markdown. The plan (plan.toml beside this file)
gives the epochs left out and the intervals' confidence.
"""
import argparse
import glob
import json
import math
import os
import statistics as st

from studies.lib import plan as planfile
from studies.lib import provenance, runlabel
from studies.lib import stats

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SKIP = PLAN["report"]["skip_epochs"]
CONFIDENCE = PLAN["report"]["confidence"]  # of every interval (studies/lib/stats.py)


def load(results):
    """{setting: {(reducer, k): [run JSON, ...]}}"""
    out = {}
    for path in sorted(glob.glob(os.path.join(results, "*", "*.json"))):
        d = json.load(open(path))
        provenance.check_run(d, PLAN, path)
        c = d["config"]
        reducer = runlabel.reducer(c)
        k = c["rank"] if runlabel.has_rank(reducer) else 0
        out.setdefault(os.path.basename(os.path.dirname(path)), {}).setdefault(
            (reducer, k), []).append(d)
    return out


def summarize_config(runs):
    epochs = [e for d in runs for e in d["epochs"][SKIP:]]  # the plan's warm-up epochs excluded
    samples = [e["batch_ms_mean"] for e in epochs]
    if len(samples) >= 2:
        iv = stats.mean_interval(samples, CONFIDENCE)
        m, hw, n = iv.estimate, iv.high - iv.estimate, iv.n
    else:  # one epoch: no interval
        m, hw, n = st.mean(samples), math.inf, len(samples)
    hook = [x for e in epochs for x in (e.get("hook_ms") or []) if x is not None]
    tail = [x for e in epochs for x in (e.get("tail_ms") or []) if x is not None]
    return dict(ms=m, ms_hw=hw, epochs=n, batches=sum(e["steps"] for e in epochs), runs=len(runs),
                samples=samples,
                hook_ms=st.mean(hook) if hook else None, tail_ms=st.mean(tail) if tail else None,
                loadavg=[round(d["machine"]["loadavg_start"][0], 1) for d in runs])


ROWS = [("Full precision", ("allreduce", 0), ("lowrank-exact", 0)),
        ("Float16", ("fp16", 0), None)]


def rows(ranks):
    out = list(ROWS)
    for k in ranks:
        out += [(f"Rank {k}", ("torch-powersgd", k), ("lowrank", k)),
                (f"Rank {k}, PyTorch's hook waited per bucket", ("torch-powersgd-waited", k), None)]
    return out


def summarize(data):
    out = {}
    for setting, configs in data.items():
        s = {f"{r}" + (f"_r{k}" if k else ""): summarize_config(runs) for (r, k), runs in configs.items()}
        local = s.get("local")
        for key, c in s.items():
            if local and key != "local" and len(c["samples"]) > 1 and len(local["samples"]) > 1:
                w = stats.welch_difference(c["samples"], local["samples"], CONFIDENCE)
                c["overhead_ms"], c["overhead_lo"], c["overhead_hi"] = w.estimate, w.low, w.high
        out[setting] = s
    return out


def targets(summary, k=4, torch_key="torch-powersgd"):
    """Issue 12's time targets, per setting: lowrank's overhead interval at rank k against the
    PyTorch hook's (a third) and full precision's (a tenth). torch_key: the chained hook; the
    waited one ("torch-powersgd-waited") only when asked."""
    out = {}
    for setting, s in summary.items():
        lr, tp, fp = s.get(f"lowrank_r{k}"), s.get(f"{torch_key}_r{k}"), s.get("allreduce")
        if not (lr and tp and fp and "overhead_hi" in lr):
            continue
        out[setting] = dict(
            lowrank_hi=lr["overhead_hi"], torch_lo=tp["overhead_lo"], full_lo=fp["overhead_lo"],
            third_of_torch=lr["overhead_hi"] <= tp["overhead_lo"] / 3,
            tenth_of_full=lr["overhead_hi"] <= fp["overhead_lo"] / 10)
        # The hooks' own time outside the backward computation, measured per batch rather than as
        # a difference of two noisy means: lowrank's against PyTorch's and against lowrank-exact's.
        ex = s.get("lowrank-exact")
        if lr.get("hook_ms") is not None and tp.get("hook_ms") is not None:
            own = lr["hook_ms"] + lr["tail_ms"]
            out[setting].update(hook_outside_lowrank=own,
                                hook_outside_torch=tp["hook_ms"] + tp["tail_ms"],
                                hook_outside_exact=(ex["hook_ms"] + ex["tail_ms"]) if ex else None)
    return out


def cell(c):
    if c is None:
        return "—"
    txt = f"{c['ms']:.1f} ± {c['ms_hw']:.1f}"
    if "overhead_ms" in c:
        txt += f" (+{c['overhead_ms']:.1f} [{c['overhead_lo']:.1f}, {c['overhead_hi']:.1f}])"
    return txt


def order(settings):
    """Slowest link first, loopback last."""
    def bits(s):
        if s == "loopback":
            return math.inf
        num = s.lower().rstrip("bit")
        mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(num[-1:], 1)
        return float(num.rstrip("kmg")) * mult
    return sorted(settings, key=bits)


def markdown(summary, tg, tg_waited):
    lines, level = [], f"{CONFIDENCE:.0%}"
    for setting in order(summary):
        s = summary[setting]
        ranks = sorted({int(key.split("_r")[1]) for key in s if "_r" in key})
        loc = s.get("local")
        lines += [f"### {setting}", "",
                  f"Time per batch in ms, mean ± {level} half-width over epochs (the first of each run "
                  f"excluded); in brackets the overhead over `local` and its {level} interval. "
                  f"`local` (no reduction): {cell(loc)} ms"
                  + (f" ({loc['epochs']} epochs, {loc['batches']} batches)" if loc else "") + ".", "",
                  "| | PyTorch | lowrank |", "|---|---|---|"]
        for label, torch_key, lowrank_key in rows(ranks):
            def get(key):
                return s.get(f"{key[0]}" + (f"_r{key[1]}" if key[1] else "")) if key else None
            if get(torch_key) is None and get(lowrank_key) is None:
                continue
            lines.append(f"| {label} | {cell(get(torch_key))} | {cell(get(lowrank_key))} |")
        lines += ["", "Hook time per batch outside the backward computation, ms (inside the hook "
                  "call + the tail after the last bucket's call):", "",
                  "| configuration | in hook | tail | sum | batches | load at start |",
                  "|---|---|---|---|---|---|"]
        for key in sorted(s):
            c = s[key]
            if c["hook_ms"] is None:
                continue
            lines.append(f"| {key} | {c['hook_ms']:.1f} | {c['tail_ms']:.1f} | "
                         f"{c['hook_ms'] + c['tail_ms']:.1f} | {c['batches']} | "
                         f"{', '.join(map(str, c['loadavg']))} |")
        for tgt, which in ((tg, "PyTorch's hook"), (tg_waited, "PyTorch's hook waited per bucket (a "
                                                      "handicapped baseline)")):
            if setting not in tgt:
                continue
            t = tgt[setting]
            lines += ["", f"Targets at rank 4 against {which}: lowrank's overhead upper end "
                      f"{t['lowrank_hi']:.1f} ms; a third of PyTorch's hook's lower end {t['torch_lo'] / 3:.1f} ms: "
                      f"{'met' if t['third_of_torch'] else 'NOT met'}; a tenth of full precision's "
                      f"lower end {t['full_lo'] / 10:.1f} ms: "
                      f"{'met' if t['tenth_of_full'] else 'NOT met'}."]
            if "hook_outside_lowrank" in t:
                lines += ["", f"Hook time outside the backward computation at rank 4: lowrank "
                          f"{t['hook_outside_lowrank']:.1f} ms, PyTorch's hook "
                          f"{t['hook_outside_torch']:.1f} ms (ratio "
                          f"{t['hook_outside_lowrank'] / t['hook_outside_torch']:.2f})"
                          + (f", lowrank-exact {t['hook_outside_exact']:.1f} ms (ratio "
                             f"{t['hook_outside_lowrank'] / t['hook_outside_exact']:.2f})"
                             if t.get("hook_outside_exact") else "") + "."]
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args()
    data = load(args.results)
    if not data:
        raise SystemExit(f"studies.time.report: no runs under {args.results}")
    summary = summarize(data)
    tg, tg_waited = targets(summary), targets(summary, torch_key="torch-powersgd-waited")
    md = markdown(summary, tg, tg_waited)
    base = os.path.join(os.path.abspath(args.results), "summary")
    for s in summary.values():
        for c in s.values():
            c["samples"] = [round(x, 3) for x in c["samples"]]
    with open(base + ".json", "w") as f:
        json.dump(dict(settings=summary, targets=tg, targets_waited=tg_waited), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
