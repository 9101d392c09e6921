#!/usr/bin/env bash
# alternate_hosts.sh: issue 44 on the honest wire: alternating PowerSGD (LOWRANK_ALTERNATE=1, one
# factor allreduce per call) against PowerSGD (LOWRANK_ALTERNATE=0, two dependent ones), the same
# perf binary, across HOSTS hosts (the paper's case: 8 and 16, 100 Mbit/s, 1 ms one way).
#
# Plan (fixed before the run; studies/netns/results/issue44_wire_plan.md states it):
#   per host count H: H hosts (studies/lib/netns_hosts.sh) at RATE and one-way DELAY, calibrated
#   first (studies/lib/calibrate.py; a failed calibration refuses that host count: no run over
#   those links, the failure recorded); ResNet-50 shapes (studies/lib/gradsets.py), one perf
#   process per host, UCX over TCP only, each side as a user runs it (links probed when the
#   communicator is made, the library's own algorithm choice: LOWRANK_UCX_ALGO and
#   LOWRANK_UCX_PROBE unset). PAIRS pairs per host count, each a PowerSGD run and an alternating
#   run, in an order that alternates from pair to pair (PowerSGD first in odd pairs); before each
#   pair the machine is given up to QUIET_S seconds to fall to at most QUIET of its CPU busy
#   (studies.lib.procstat.wait_quiet; decided from the machine alone; the run goes on after it).
#   A run = `--mode powersgd -k 4 -n ITERS -w 1 --rounds 1 --phases 1 --triad-mib 0` (ITERS even).
#   Metric: comm_us (the comm phase alone: PowerSGD's two factor allreduces per call, alternating's
#   one, the mean of a P-sized and a Q-sized one), alternate/PowerSGD per pair; also the time per
#   call (out-of-place, the slowest rank) and wire_bytes per call. Verdict per host count: the
#   one-sided 95% upper bound of the geometric-mean ratio of comm_us
#   (studies.lib.stats.paired_ratio_upper_bound) <= BOUND (0.6): "met", else "not met".
# usage (root): studies/netns/alternate_hosts.sh --perf PERF [--hosts 8,16] [--rate 100mbit]
#   [--delay 1ms] [--pairs 5] [--iters 4] [--bound 0.6] [--quiet 0.5] [--quiet-s 120]
#   [--gradients DIR] [--built-from REV] [--out studies/netns/results/issue44_wire]
# --built-from: the commit the perf binary's library was built from, checked against the
# library's sources digest and recorded. The perf processes run with oom_score_adj 1000 (choom):
# 16 processes need about 1.1 GiB each, and if the machine runs short the OOM killer takes one of
# them (the run fails, recorded) rather than someone else's work. Writes OUT.json (every run's JSON rows, the transport
# chosen, the calibrations, provenance) and OUT.md (the table and the verdicts): studies/netns/
# alternate_report.py. Exit status 1 if a host count was refused or a run failed (reported so).
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
HOSTS_LIST=8,16 RATE=100mbit DELAY=1ms PAIRS=5 ITERS=4 BOUND=0.6 QUIET=0.5 QUIET_S=120
PERF= GDIR= BUILT= OUT=$HERE/results/issue44_wire PY=/usr/bin/python3
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) HOSTS_LIST=$2; shift 2 ;; --rate) RATE=$2; shift 2 ;; --delay) DELAY=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;; --iters) ITERS=$2; shift 2 ;; --bound) BOUND=$2; shift 2 ;;
    --quiet) QUIET=$2; shift 2 ;; --quiet-s) QUIET_S=$2; shift 2 ;; --perf) PERF=$2; shift 2 ;;
    --gradients) GDIR=$2; shift 2 ;; --built-from) BUILT=$2; shift 2 ;; --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "alternate_hosts.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "alternate_hosts.sh: needs root" >&2; exit 2; }
[ -x "$PERF" ] || { echo "alternate_hosts.sh: --perf: a lowrank_allreduce_perf binary" >&2; exit 2; }
[ $((ITERS % 2)) = 0 ] || { echo "alternate_hosts.sh: --iters must be even (as many P as Q calls)" >&2; exit 2; }
PERF=$(cd "$(dirname "$PERF")" && pwd)/$(basename "$PERF")
MAXH=$(tr , '\n' <<<"$HOSTS_LIST" | sort -n | tail -1)
if [ -z "$GDIR" ]; then
  GDIR=${TMPDIR:-/tmp}/lowrank-gradsets/resnet50-w$MAXH
  "$PY" "$ROOT/studies/lib/gradsets.py" resnet50 "$GDIR" "$MAXH" >/dev/null || { echo "alternate_hosts.sh: no gradients" >&2; exit 1; }
fi
WORK=$(mktemp -d)
HOSTS_PY=$PY
. "$ROOT/studies/lib/netns_hosts.sh"
trap 'hosts_down; rm -rf "$WORK"' EXIT
trap 'echo "alternate_hosts.sh: interrupted" >&2; exit 130' INT TERM
export PYTHONPATH=$ROOT
quiet() {  # prints the seconds waited and the last busy fraction
  "$PY" -c 'import sys, time; from studies.lib import procstat
t0 = time.monotonic(); procstat.wait_quiet(float(sys.argv[1]), t0 + float(sys.argv[2]), pause_s=5.0)
print(f"{time.monotonic() - t0:.0f} {procstat.busy_fraction(1.0):.2f}")' "$QUIET" "$QUIET_S" | tail -1
}

# run H PAIR SIDE ALT: one perf process per host; rank r's JSON in $WORK/h<H>.p<PAIR>.<SIDE>.r<r>.json
run() {
  local h=$1 tag=h$1.p$2.$3 alt=$4 port=$((20000 + RANDOM % 12000)) pids=() i p rc=0 t0
  t0=$(date +%s.%N)
  for i in $(seq 0 $((h - 1))); do
    hosts_exec $i env -u LOWRANK_UCX_ALGO -u LOWRANK_UCX_PROBE LOWRANK_ALTERNATE=$alt \
      RANK=$i WORLD_SIZE=$h MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      LOWRANK_SOCKET_IFNAME=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 \
      choom -n 1000 -- timeout 900 "$PERF" -t 1 --gradients "$GDIR" --step synth --mode powersgd -k 4 -n $ITERS -w 1 \
      --rounds 1 --phases 1 --triad-mib 0 -J "$WORK/$tag.r$i.json" >"$WORK/$tag.o$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || rc=1; done
  if [ $rc != 0 ]; then
    echo "alternate_hosts.sh: $tag failed; rank 0's last lines:" >&2; tail -5 "$WORK/$tag.o0" >&2
    echo "$h $2 $3 FAILED $WORK/$tag" >>"$WORK/runs.txt"; return 1
  fi
  echo "$h $2 $3 $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') $WORK/$tag" >>"$WORK/runs.txt"
  grep -E '^# *(schedule|transport)' "$WORK/$tag.o0" | head -2 | cut -c1-160
}

echo "# alternate_hosts: $(date -Is), $(nproc) cores, perf $PERF, hosts $HOSTS_LIST, $RATE, $DELAY one way," \
  "$PAIRS pairs, -n $ITERS; load $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m studies.lib.provenance start --binary "$PERF" >"$WORK/provenance.json" || exit 1
: >"$WORK/runs.txt"; : >"$WORK/calibs.txt"; : >"$WORK/quiet.txt"
status=0
for h in ${HOSTS_LIST//,/ }; do
  HOSTS_RATE=$RATE HOSTS_DELAY=$DELAY hosts_up $h || exit 1
  hosts_link >"$WORK/link"
  echo "# ---- $h hosts, link $(hosts_link) ($(hosts_settings)); quiet: $(quiet)"
  if "$PY" -m studies.lib.calibrate --tag $HOSTS_TAG --hosts $h --out "$WORK/calib.$h.json" | sed 's/^/# /'; then
    echo "$h passed $WORK/calib.$h.json" >>"$WORK/calibs.txt"
    for p in $(seq 1 $PAIRS); do
      q=$(quiet)
      echo "$h $p $q" >>"$WORK/quiet.txt"
      if [ $((p % 2)) = 1 ]; then run $h $p powersgd 0 && run $h $p alternate 1
      else run $h $p alternate 1 && run $h $p powersgd 0; fi || { status=1; break; }
      echo "# $h hosts: pair $p done (waited, busy before: $q); load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  else
    echo "alternate_hosts.sh: the links of $h hosts failed their calibration: no run over them" >&2
    echo "$h failed $WORK/calib.$h.json" >>"$WORK/calibs.txt"; status=1
  fi
  hosts_down
done
mkdir -p "$(dirname "$OUT")"
"$PY" "$HERE/alternate_report.py" --runs "$WORK/runs.txt" --calibs "$WORK/calibs.txt" \
  --quiet "$WORK/quiet.txt" --provenance "$WORK/provenance.json" --out "$OUT" --perf "$PERF" \
  --gradients "$GDIR" --rate "$RATE" --delay "$DELAY" --bound "$BOUND" --pairs "$PAIRS" \
  --link "$(cat "$WORK/link" 2>/dev/null || echo wire)" ${BUILT:+--built-from "$BUILT"} || status=1
exit $status
