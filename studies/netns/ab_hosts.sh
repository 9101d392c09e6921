#!/usr/bin/env bash
# ab_hosts.sh: A/B of two lowrank_allreduce_perf builds across 4 hosts on the honest wire (issue 40:
# "ResNet-50 shapes, k = 4, world 4, 1 Gbit/s: no slower than today; exact within 1.1x of the ring").
#
# Plan (fixed before the run; studies/netns/results/issue40_ab_plan.md states it):
#   hosts: 4 (studies/lib/netns_hosts.sh), RATE (default 1gbit), one-way DELAY (default 0.25ms),
#   calibrated first (a failed calibration refuses the run); ResNet-50 shapes (studies/lib/gradsets.py),
#   one process per host, UCX over TCP only.
#   PAIRS pairs (default 10), each: base and cand, in an order that alternates from pair to pair;
#   a run = `--mode powersgd -k 4 -n 5 -w 1 --rounds 3`, and for cand also `--mode exact -k 0 -n 3
#   -w 1` as chosen and with LOWRANK_UCX_ALGO=ring. Each side runs as a
#   user's would (the links measured at creation where the build does that).
#   Metric: time per call, out-of-place, the slowest rank (perf's time). Verdict: cand/base of
#   powersgd, paired by pair: one-sided 95% upper bound of the geometric mean ratio <= 1.03 (no
#   slowdown shown; studies.lib.stats.paired_ratio_upper_bound); cand's exact as chosen over
#   cand's exact with the ring: median ratio <= 1.1.
# usage (root): studies/netns/ab_hosts.sh --base BASE_PERF --cand CAND_PERF [--pairs 10]
#               [--rate 1gbit] [--delay 0.25ms] [--out studies/netns/results/issue40_ab]
# writes OUT.json and OUT.md.
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PAIRS=10 RATE=1gbit DELAY=0.25ms OUT=$HERE/results/issue40_ab PY=/usr/bin/python3 BASE= CAND=
while [ $# -gt 0 ]; do
  case $1 in
    --base) BASE=$2; shift 2 ;; --cand) CAND=$2; shift 2 ;; --pairs) PAIRS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;; --delay) DELAY=$2; shift 2 ;; --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "ab_hosts.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "ab_hosts.sh: needs root" >&2; exit 2; }
[ -x "$BASE" ] && [ -x "$CAND" ] || { echo "ab_hosts.sh: --base and --cand: perf binaries" >&2; exit 2; }
GDIR=${TMPDIR:-/tmp}/lowrank-gradsets/resnet50
"$PY" "$ROOT/studies/lib/gradsets.py" resnet50 "$GDIR" 4 >/dev/null || { echo "ab_hosts.sh: no gradients" >&2; exit 1; }
N=4 WORK=$(mktemp -d)
HOSTS_PY=$PY
. "$ROOT/studies/lib/netns_hosts.sh"
trap 'hosts_down; rm -rf "$WORK"' EXIT
trap 'echo "ab_hosts.sh: interrupted" >&2; exit 130' INT TERM
HOSTS_RATE=$RATE HOSTS_DELAY=$DELAY hosts_up $N || exit 1
PYTHONPATH=$ROOT "$PY" -m studies.lib.calibrate --tag $HOSTS_TAG --hosts $N --out "$WORK/calib.json" | sed 's/^/# /' ||
  { echo "ab_hosts.sh: the links failed their calibration: run refused" >&2; exit 1; }

# run TAG PERF [ENV...] -- PERF ARGS: one process per host; rank r's JSON in $WORK/TAG.r<r>.json
run() {
  local tag=$1 perf=$2 env=() port=$((20000 + RANDOM % 12000)) pids=() i p rc=0
  shift 2
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  for i in $(seq 0 $((N - 1))); do
    hosts_exec $i env RANK=$i WORLD_SIZE=$N MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      LOWRANK_SOCKET_IFNAME=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 "${env[@]}" \
      timeout 600 "$perf" -t 1 --gradients "$GDIR" --step synth "$@" --triad-mib 0 \
      -J "$WORK/$tag.r$i.json" >"$WORK/$tag.o$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || rc=1; done
  [ $rc = 0 ] || { echo "ab_hosts.sh: $tag failed:" >&2; tail -3 "$WORK/$tag.o0" >&2; exit 1; }
  echo "$tag $WORK/$tag" >>"$WORK/runs.txt"
}
side() {  # side NAME PERF PAIR
  run "p$3.$1.powersgd" "$2" -- --mode powersgd -k 4 -n 5 -w 1 --rounds 3
  # exact only on the candidate: its choice against the ring (the base's exact decides nothing)
  [ "$1" = cand ] || return 0
  run "p$3.$1.exact" "$2" -- --mode exact -k 0 -n 3 -w 1 --rounds 1
  run "p$3.$1.exactring" "$2" LOWRANK_UCX_ALGO=ring -- --mode exact -k 0 -n 3 -w 1 --rounds 1
}
echo "# ab_hosts: $(date -Is), base $BASE, cand $CAND, $PAIRS pairs, $RATE, $DELAY; load $(cut -d' ' -f1-3 /proc/loadavg)"
PYTHONPATH=$ROOT "$PY" -m studies.lib.provenance start --binary "$CAND" >"$WORK/provenance.json" || exit 1
: >"$WORK/runs.txt"
for p in $(seq 1 $PAIRS); do
  if [ $((p % 2)) = 1 ]; then side base "$BASE" $p; side cand "$CAND" $p; else side cand "$CAND" $p; side base "$BASE" $p; fi
  echo "# pair $p done; load $(cut -d' ' -f1-3 /proc/loadavg)"
done
mkdir -p "$(dirname "$OUT")"
PYTHONPATH=$ROOT "$PY" - "$WORK/runs.txt" "$OUT" "$WORK/calib.json" "$WORK/provenance.json" "$BASE" "$CAND" "$RATE" "$DELAY" <<'PY'
import glob, json, statistics, sys
from studies.lib import provenance, stats
runs, out, calib, prov, base, cand, rate, delay = sys.argv[1:9]
t, info = {}, {}
for line in open(runs):
    tag, prefix = line.split()
    pair, side, mode = tag.split(".")
    rows = [json.load(open(f))["results"][0] for f in sorted(glob.glob(prefix + ".r*.json"))]
    t.setdefault((side, mode), {})[int(pair[1:])] = max(r["out_of_place"]["time"] for r in rows)
    tr = [l for l in open(prefix + ".o0") if l.startswith("# transport (")]
    if tr:
        info.setdefault((side, mode), []).append(json.loads(tr[0][tr[0].index("{"):]))
pairs = sorted(t[("cand", "powersgd")])
c, b = [t[("cand", "powersgd")][p] for p in pairs], [t[("base", "powersgd")][p] for p in pairs]
ub = stats.paired_ratio_upper_bound(c, b).upper
iv = stats.paired_ratio(c, b)
ce, cr = [t[("cand", "exact")][p] for p in pairs], [t[("cand", "exactring")][p] for p in pairs]
exr = statistics.median(x / y for x, y in zip(ce, cr))
res = dict(rate=rate, delay=delay, pairs=len(pairs), base=base, cand=cand,
           powersgd_us=dict(base=b, cand=c), exact_us=dict(cand=ce, cand_ring=cr),
           powersgd_ratio=dict(estimate=iv.estimate, low95=iv.low, high95=iv.high, upper95=ub),
           exact_over_ring_median=exr, verdict_powersgd="no slowdown shown" if ub <= 1.03 else "not shown",
           verdict_exact="met" if exr <= 1.1 else "NOT met",
           transport={f"{s}.{m}": v for (s, m), v in info.items()},
           calibration=json.load(open(calib)), provenance=provenance.finish(json.load(open(prov))))
json.dump(res, open(out + ".json", "w"), indent=1)
med = lambda v: statistics.median(v) / 1e3
md = [f"# A/B on 4 wire hosts, {rate}, {delay} one way: ResNet-50 shapes, k = 4", "",
      f"- base `{base}`, cand `{cand}`, {len(pairs)} pairs, order alternating; script studies/netns/ab_hosts.sh",
      f"- powersgd k=4, ms per call (median): base {med(b):.2f}, cand {med(c):.2f}; cand/base "
      f"{iv.estimate:.4f} [95%: {iv.low:.4f}, {iv.high:.4f}], one-sided upper 95% {ub:.4f} "
      f"(bound 1.03): **{res['verdict_powersgd']}**",
      f"- exact, ms per call (median): cand as chosen {med(ce):.1f}, cand with the "
      f"ring {med(cr):.1f}; cand chosen/ring median {exr:.3f} (bound 1.1): **{res['verdict_exact']}**"]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
