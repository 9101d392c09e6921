"""The analysis of switching runs (studies/switch/driver.py), fixed before any data (issue 27; the
protocol in docs/training.md). Pure functions of the per-run JSON; report.py prints them; the
numbers of the rule are plan.toml's [analysis], which the run reads too.

The unit is the run. Each run gives, per reducer, one time per batch: the mean (and the median)
over its kept steps (every measured block's steps after the first --drop-steps; rank 0's step
times, as train.py's batch_ms). Reducers are compared within a run, then over runs:
- ratio to `local`, and between reducers: t-interval over the runs' log-ratios, back-transformed
  (a geometric mean ratio with its interval: stats.paired_ratio);
- overhead = time - local's time, per run, in ms: mean with its t-interval, and the median;
- ratio of overheads (the targets): Fieller's interval for paired data
  (stats.paired_fieller_ratio), i.e. the values rho for which the t-test over runs of
  (overhead_a - rho * overhead_b) does not reject 0. Not a log-ratio: a run's overhead can be
  <= 0 through noise, where a log is undefined, and the Fieller set needs no sign. When the denominator's overhead is not clearly above 0, the set is
  unbounded and nothing is decided.

Decision rule, per target (decide()): at least MIN_RUNS runs, else UNDECIDED; the Fieller
interval bounded with the denominator's mean overhead above 0, else UNDECIDED; MET if its upper
end <= the target, NOT MET if its lower end > the target, UNDECIDED otherwise. Equivalently
(tested), MET iff the upper end of the t-interval of the contrast overhead_a - target *
overhead_b is below 0. Runs from a tree with uncommitted changes, or whose replicas ended
different, are left out (listed by the report). Every interval is at plan.toml's
[analysis] confidence, computed by studies/lib/stats.py.
"""
import math
import statistics as st

from studies.lib import plan as planfile
from studies.lib import stats

_RULE = planfile.load(__file__)["analysis"]
MIN_RUNS = _RULE["min_runs"]
CONFIDENCE = _RULE["confidence"]
# (numerator, denominator, largest ratio of overheads)
TARGETS = [(t["numerator"], t["denominator"], t["largest"]) for t in _RULE["targets"]]
TARGET_SETTINGS = tuple(_RULE["target_settings"])
TARGET_RANK = _RULE["target_rank"]
BYTES_TOLERANCE = _RULE["bytes_tolerance"]


# ---- intervals over runs (studies/lib/stats.py) --------------------------------------------------
def _interval(xs):
    """stats.mean_interval of xs at CONFIDENCE, or None below 2 runs (one run gives no interval)."""
    return stats.mean_interval(xs, CONFIDENCE) if len(xs) >= 2 else None


def decide(a, b, target):
    """The decision rule for 'overhead a <= target * overhead b' over paired runs:
    (verdict, reason) with verdict MET, NOT MET or UNDECIDED."""
    n = len(a)
    if n < MIN_RUNS:
        return "UNDECIDED", f"{n} runs, fewer than {MIN_RUNS}"
    f = stats.paired_fieller_ratio(a, b, CONFIDENCE)
    if not f.bounded or st.mean(b) <= 0:
        return "UNDECIDED", f"the denominator's overhead is not clearly above 0 ({f.kind} interval)"
    if f.high <= target:
        return "MET", f"upper end {f.high:.3g} <= {target:.3g}"
    if f.low > target:
        return "NOT MET", f"lower end {f.low:.3g} > {target:.3g}"
    return "UNDECIDED", f"interval [{f.low:.3g}, {f.high:.3g}] contains {target:.3g}"


# ---- one run -------------------------------------------------------------------------------------
def usable(result):
    """(True, "") or (False, why) for a run's JSON: committed tree, identical replicas."""
    git = (result.get("machine") or {}).get("git") or ""
    if not git:
        return False, "no git revision recorded"
    if git.endswith("-dirty"):
        return False, f"uncommitted changes ({git})"
    if not result.get("replicas_identical"):
        return False, "replicas differ at the end"
    return True, ""


def run_summary(result, drop=None):
    """{reducer: dict(mean_ms, median_ms, steps, cpu_ms, run_delay_ms, bytes_per_step,
    retrans_per_step, model_bytes_per_step, lowrank_bytes_per_step)} for one run. Times: rank 0's
    kept steps. Per-step means of CPU time and run delay: over every rank's kept steps. Bytes per
    step: every rank's socket payload (bytes_sent - bytes_retrans: TCP's retransmissions are
    counted apart, they come with load, even on loopback) summed, over the measured blocks' steps
    (drop not applied: the counters are read per block); model and lowrank's counter summed over
    ranks likewise. ss_bytes_per_step (`ss -tin` bytes_sent over each rank's namespace) and
    link_bytes_per_step (the interface's tx bytes, headers and ACKs included), summed over ranks:
    None where the run did not count them (on loopback both see every rank: not per host)."""
    drop = result["config"]["drop_steps"] if drop is None else drop
    out = {}
    for r in result["ranks"]:
        for b in r["blocks"]:
            if b["warmup"]:
                continue
            s = out.setdefault(b["reducer"], dict(times=[], cpu=[], delay=[], sent=0, retrans=0,
                                                  steps=0, model=0.0, lowrank=0, ss=None, link=None))
            if r["rank"] == 0:
                s["times"] += b["batch_ms"][drop:]
            s["cpu"] += b["cpu_ms"][drop:]
            s["delay"] += b["run_delay_ms"][drop:]
            proc = (b.get("bytes") or {}).get("process") or {}
            s["sent"] += proc.get("bytes_sent", 0) - proc.get("bytes_retrans", 0)
            s["retrans"] += proc.get("bytes_retrans", 0)
            host, link = (b.get("bytes") or {}).get("host_ss"), (b.get("bytes") or {}).get("link")
            if host is not None:
                s["ss"] = (s["ss"] or 0) + host["bytes_sent"]
            if link is not None:
                s["link"] = (s["link"] or 0) + link["tx_bytes"]
            s["model"] += b["model_bytes_per_step"] * len(b["batch_ms"])
            s["lowrank"] += b.get("lowrank_bytes_sent", 0)
            if r["rank"] == 0:
                s["steps"] += len(b["batch_ms"])
    return {name: dict(mean_ms=st.mean(s["times"]), median_ms=st.median(s["times"]),
                       steps=len(s["times"]), cpu_ms=st.mean(s["cpu"]),
                       run_delay_ms=st.mean(s["delay"]),
                       bytes_per_step=s["sent"] / s["steps"],
                       retrans_per_step=s["retrans"] / s["steps"],
                       model_bytes_per_step=s["model"] / s["steps"],
                       lowrank_bytes_per_step=s["lowrank"] / s["steps"],
                       ss_bytes_per_step=None if s["ss"] is None else s["ss"] / s["steps"],
                       link_bytes_per_step=None if s["link"] is None else s["link"] / s["steps"])
            for name, s in out.items()}


def setting_key(result):
    c = result["config"]
    return (c.get("setting", "unlabelled"), c["world"], c["rank"])


# ---- a setting's runs ----------------------------------------------------------------------------
def compare(summaries):
    """The setting's table from its runs' run_summary()s (every run must have `local`): per
    reducer, times over runs (mean of the runs' means, median of the runs' medians), the ratio to
    local, the overhead, run delay and bytes; then the ratios of overheads and the targets'
    verdicts (targets apply only where the caller says the setting is a target setting)."""
    names = sorted({k for s in summaries for k in s}, key=lambda k: (k != "local", k))
    runs = [s for s in summaries if "local" in s]
    table = {}
    for name in names:
        rs = [s for s in runs if name in s]
        if not rs:
            continue
        means = [s[name]["mean_ms"] for s in rs]
        row = dict(runs=len(rs), mean_ms=_interval(means), median_ms=st.median(
            s[name]["median_ms"] for s in rs), run_delay_ms=st.mean(s[name]["run_delay_ms"] for s in rs),
            cpu_ms=st.mean(s[name]["cpu_ms"] for s in rs))
        floor = [s["local"]["bytes_per_step"] for s in rs]
        payload = [s[name]["bytes_per_step"] - f for s, f in zip(rs, floor)]
        model = [s[name]["model_bytes_per_step"] for s in rs]
        row["bytes_per_step"] = st.mean(payload)
        row["raw_bytes_per_step"] = st.mean(s[name]["bytes_per_step"] for s in rs)
        row["retrans_per_step"] = st.mean(s[name]["retrans_per_step"] for s in rs)
        for key in ("ss_bytes_per_step", "link_bytes_per_step"):  # beside: not floor-corrected
            vals = [s[name].get(key) for s in rs]
            row[key] = st.mean(vals) if vals and all(v is not None for v in vals) else None
        row["model_bytes_per_step"] = st.mean(model)
        if name != "local":
            row["bytes_vs_model"] = [p / m - 1 for p, m in zip(payload, model) if m > 0]
            loc = [s["local"]["mean_ms"] for s in rs]
            row["ratio_to_local"] = stats.paired_ratio(means, loc, CONFIDENCE) if len(rs) > 1 else None
            over = [a - b for a, b in zip(means, loc)]
            row["overhead_ms"] = _interval(over)
            row["overhead_median_ms"] = st.median(over)
        table[name] = row
    return table


def overheads(summaries, name):
    return [s[name]["mean_ms"] - s["local"]["mean_ms"] for s in summaries]


def targets(summaries, is_target_setting):
    """Per target pair: the ratio of overheads (Fieller), the log-ratio of times, the contrast at
    the target, and the verdict (only in a target setting: else 'reported')."""
    out = []
    for a_name, b_name, target in TARGETS:
        rs = [s for s in summaries if a_name in s and b_name in s and "local" in s]
        if len(rs) < 2:
            out.append(dict(pair=(a_name, b_name), target=target, runs=len(rs), verdict="UNDECIDED",
                            reason=f"{len(rs)} runs with both reducers"))
            continue
        a, b = overheads(rs, a_name), overheads(rs, b_name)
        fieller = stats.paired_fieller_ratio(a, b, CONFIDENCE)
        contrast = stats.mean_interval([x - target * y for x, y in zip(a, b)], CONFIDENCE)
        times = stats.paired_ratio([s[a_name]["mean_ms"] for s in rs], [s[b_name]["mean_ms"] for s in rs],
                                   CONFIDENCE)
        per_run = [x / y for x, y in zip(a, b) if y != 0]
        verdict, reason = decide(a, b, target) if is_target_setting else ("reported", "not a target setting")
        out.append(dict(pair=(a_name, b_name), target=target, runs=len(rs), fieller=fieller,
                        median_per_run=st.median(per_run) if per_run else math.nan,
                        contrast_ms=contrast, time_ratio=times, verdict=verdict, reason=reason))
    return out
