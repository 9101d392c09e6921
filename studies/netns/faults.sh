#!/usr/bin/env bash
# faults.sh: what a user on a bad network meets (issue 42, item 4), on 4 hosts of the honest wire.
#   loss: the perf binary's allreduces (exact and powersgd k = 4, sizes 64 KiB..1 MiB, --digest)
#     with no loss and with LOSS (default 1%) of every frame, REPS alternating runs each, the ring
#     pinned and nothing measured (LOWRANK_UCX_ALGO=ring, LOWRANK_UCX_PROBE=0) so the results can
#     be compared bit for bit: the digests must be the same; the time per call, lossy / clean, is
#     reported (median over runs, per size and mode).
#   cut: a long run (LOWRANK_TIMEOUT=T, default 10 s) whose host 3 link is cut CUT_AFTER s in:
#     every process must exit with an error within T + 5 s of the cut (none hangs); then the link is
#     healed and a new run (new communicators) must pass.
# usage (root): studies/netns/faults.sh [--rate 100mbit] [--delay 0.25ms] [--loss 0.01] [--reps 3]
#               [--timeout 10] [--perf build/perf/lowrank_allreduce_perf] [--out studies/netns/results/faults]
# writes OUT.json and OUT.md; exit 1 if a check fails.
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RATE=100mbit DELAY=0.25ms LOSS=0.01 REPS=3 T=10 CUT_AFTER=3 PY=/usr/bin/python3
PERF=$ROOT/build/perf/lowrank_allreduce_perf OUT=$HERE/results/faults
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift 2 ;; --delay) DELAY=$2; shift 2 ;; --loss) LOSS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;; --timeout) T=$2; shift 2 ;; --perf) PERF=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;; -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "faults.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "faults.sh: needs root" >&2; exit 2; }
[ -x "$PERF" ] || { echo "faults.sh: no perf binary at $PERF" >&2; exit 2; }
PERF=$(cd "$(dirname "$PERF")" && pwd)/$(basename "$PERF")
N=4 WORK=$(mktemp -d)
HOSTS_PY=$PY
. "$ROOT/studies/lib/netns_hosts.sh"
trap 'hosts_down; rm -rf "$WORK"' EXIT
trap 'echo "faults.sh: interrupted" >&2; exit 130' INT TERM
HOSTS_RATE=$RATE HOSTS_DELAY=$DELAY hosts_up $N || exit 1
PYTHONPATH=$ROOT "$PY" -m studies.lib.calibrate --tag $HOSTS_TAG --hosts $N --out "$WORK/calib.json" | sed 's/^/# /' ||
  { echo "faults.sh: the links failed their calibration: run refused" >&2; exit 1; }
PYTHONPATH=$ROOT "$PY" -m studies.lib.provenance start --binary "$PERF" >"$WORK/provenance.json" || exit 1

# start TAG ARGS...: one perf process per host in the background; pids in PIDS
start() {
  local tag=$1 port=$((20000 + RANDOM % 12000)) i
  shift
  PIDS=()
  for i in $(seq 0 $((N - 1))); do
    hosts_exec $i env RANK=$i WORLD_SIZE=$N MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      LOWRANK_SOCKET_IFNAME=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 LOWRANK_UCX_ALGO=ring \
      LOWRANK_UCX_PROBE=0 LOWRANK_TIMEOUT=$T \
      timeout 900 "$PERF" -t 1 --triad-mib 0 "$@" -J "$WORK/$tag.r$i.json" >"$WORK/$tag.o$i" 2>&1 &
    PIDS+=($!)
  done
}
finish() { local rc=0 p; for p in "${PIDS[@]}"; do wait $p || rc=1; done; return $rc; }

echo "# faults: $(date -Is), $RATE, $DELAY, loss $LOSS, $REPS reps; perf $PERF; load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/runs.txt"
for rep in $(seq 1 $REPS); do
  for l in $([ $((rep % 2)) = 1 ] && echo "0 $LOSS" || echo "$LOSS 0"); do
    hosts_loss $l || exit 1
    tag=loss$l.rep$rep
    start $tag -M exact,powersgd -k 4 -b 64K -e 1M -f 4 -n 5 -w 1 --rounds 1 --digest
    finish || { echo "faults.sh: $tag failed:" >&2; tail -3 "$WORK/$tag.o0" >&2; exit 1; }
    echo "$l $rep $WORK/$tag $(hosts_link_stats | grep -o 'lost [0-9]*')" >>"$WORK/runs.txt"
  done
done
hosts_loss 0

# the cut: host 3's link, CUT_AFTER s into a run of many calls
start cut -M exact -b 256K -e 256K -n 1000000 -w 1 --rounds 1
sleep $CUT_AFTER
t_cut=$(date +%s.%N)
hosts_cut 3 || exit 1
: >"$WORK/cut.txt"
# each process's end, polled every 0.1 s (its status by wait, once it is gone); one still running
# T + 60 s after the cut is a hang
declare -A ENDED=()
deadline=$(( $(date +%s) + T + 60 ))
while [ ${#ENDED[@]} -lt $N ] && [ "$(date +%s)" -lt $deadline ]; do
  for i in $(seq 0 $((N - 1))); do
    [ -n "${ENDED[$i]:-}" ] && continue
    if ! kill -0 ${PIDS[$i]} 2>/dev/null; then
      t=$(date +%s.%N); rc=0; wait ${PIDS[$i]} || rc=$?
      ENDED[$i]=1; echo "$i $rc $t" >>"$WORK/cut.txt"
    fi
  done
  sleep 0.1
done
for i in $(seq 0 $((N - 1))); do
  [ -n "${ENDED[$i]:-}" ] || { echo "$i hang $(date +%s.%N)" >>"$WORK/cut.txt"
    ip netns pids ${HOSTS_TAG}h$i | xargs -r kill -9 2>/dev/null; }  # the perf process itself
done
hosts_heal 3 || exit 1
sleep 1
start after -M exact,powersgd -k 4 -b 64K -e 256K -f 4 -n 3 -w 1 --rounds 1
finish; after_rc=$?

mkdir -p "$(dirname "$OUT")"
PYTHONPATH=$ROOT "$PY" - "$WORK" "$OUT" "$LOSS" "$T" "$t_cut" "$after_rc" "$RATE" "$DELAY" <<'PY'
import glob, json, statistics, sys
from studies.lib import provenance
work, out, loss, T, t_cut, after_rc, rate, delay = sys.argv[1:9]
T, t_cut, after_rc = float(T), float(t_cut), int(after_rc)
digests, times, lost = {}, {}, {}
for line in open(f"{work}/runs.txt"):
    l, rep, prefix, *rest = line.split()
    lost.setdefault(l, []).append(int(rest[1]) if len(rest) > 1 else None)
    digests.setdefault(l, []).append(sorted(x for x in open(prefix + ".o0") if x.startswith("# digest")))
    rows = [json.load(open(f))["results"] for f in sorted(glob.glob(prefix + ".r*.json"))]
    for rs in zip(*rows):
        key = f"{rs[0]['lowrank']['mode']} {rs[0]['size']}"
        times.setdefault(l, {}).setdefault(key, []).append(max(r["out_of_place"]["time"] for r in rs))
clean, lossy = "0", loss
same = all(d == digests[clean][0] for k in digests for d in digests[k]) and bool(digests[clean][0])
ratios = {k: statistics.median(times[lossy][k]) / statistics.median(times[clean][k]) for k in times[clean]}
cut = []
for line in open(f"{work}/cut.txt"):
    i, rc, t = line.split()
    cut.append(dict(host=int(i), rc=rc, after_cut_s=None if rc == "hang" else float(t) - t_cut))
ok_cut = all(c["rc"] not in ("0", "hang") and c["after_cut_s"] <= T + 5 for c in cut)
res = dict(rate=rate, delay=delay, loss=float(loss), timeout_s=T, digests_identical=same,
           lossy_over_clean=ratios, frames_lost=lost, cut=cut, cut_ok=ok_cut,
           after_heal_rc=after_rc, calibration=json.load(open(f"{work}/calib.json")),
           provenance=provenance.finish(json.load(open(f"{work}/provenance.json"))))
json.dump(res, open(out + ".json", "w"), indent=1)
md = [f"# Faults on the wire: 4 hosts, {rate}, {delay} one way (studies/netns/faults.sh)", "",
      f"- loss {float(loss):.0%} of every frame: results bit-identical to no loss (digests of every "
      f"comm rank, every row): **{'yes' if same else 'NO'}**; frames lost per lossy run: "
      f"{lost.get(lossy)}",
      "- time per call, lossy / clean (median over runs): " +
      ", ".join(f"{k}: {v:.2f}" for k, v in sorted(ratios.items())),
      f"- host 3's link cut mid-run (LOWRANK_TIMEOUT={T:g} s): " +
      ", ".join(f"host {c['host']} exit {c['rc']} after {c['after_cut_s']:.1f} s" if c['after_cut_s'] is not None
                else f"host {c['host']} HUNG" for c in sorted(cut, key=lambda c: c['host'])) +
      f": every process failed within the timeout + 5 s: **{'yes' if ok_cut else 'NO'}**",
      f"- healed, a new run (new communicators): **{'passed' if after_rc == 0 else 'FAILED'}**"]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if same and ok_cut and after_rc == 0 else 1)
PY
