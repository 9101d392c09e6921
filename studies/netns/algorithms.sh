#!/usr/bin/env bash
# netns_algorithms.sh: the host transport's allreduce algorithms side by side over links with a
# delay and a rate (issue 24, item 4), and how close the cost model's choice (auto) comes to the best.
#
# For each world (hosts, one perf process each), delay (one way) and rate, on the links of
# studies/lib/netns_hosts.sh (netem where the kernel has it, else the user-space wire), calibrated
# at every setting first (studies/lib/calibrate.py: a setting that fails stops the sweep, exit 1;
# the calibrations go into OUT.json as "calibration"), R repetitions;
# within a repetition every algorithm runs once (ring, halving_doubling, recursive_doubling,
# direct, auto: LOWRANK_UCX_ALGO), in an order rotated from one repetition to the next, so that drift
# of the machine hits all alike. A run is `lowrank_allreduce_perf -M exact` over the sizes of one
# size group (-n calls after -w warm-up: many at small sizes, for a stable mean, few at large ones);
# its time per call (out-of-place, mean over -n calls, slowest rank) is one sample: the run, not the
# call, is the statistical unit; the report gives the median over repetitions and its min-max.
# auto runs as a user's would: the links measured when each communicator is made (issue 40,
# LOWRANK_UCX_PROBE), its choice and constants recorded from the perf binary's "# transport" line;
# MODEL_AUTO=1 gives it LOWRANK_UCX_ALPHA_US = delay + --sw-alpha-us and LOWRANK_UCX_BETA_NS =
# 8e9 / rate instead (the link's own figures, as before the probe).
#
# Keeping CPU out of the result. This machine has few cores (2 here): more processes than cores
# measure the scheduler, not the network. So (1) every world is also run with no qdisc at all (no
# delay, no rate limit), every algorithm, same sizes and repetitions: the CPU floor of each point, shown
# beside it; a point whose floor is more than 20% of its time is flagged (the network did not dominate);
# (2) with --pin 1 (default) host i's process is pinned to core i mod cores, so that no process
# migrates (it does not give a process a core of its own when there are more hosts than cores).
#
# Needs root and iproute2; without sch_netem the links are the wire's (/dev/net/tun, g++). The CPU
# floor's "no qdisc" is, on the wire, the wire with neither rate nor delay (a switch in user space).
#
# usage (root): studies/netns/algorithms.sh [--worlds 4,8,16] [--delays 0.25ms,1ms] [--rates 100mbit,1gbit]
#     [--algos ring,halving_doubling,recursive_doubling,direct,auto] [--reps 3]
#     [--groups 256:16K:40:5,64K:256K:10:2,1M:4M:3:1]  (MIN:MAX:ITERS:WARMUP, x4 steps)
#     [--sw-alpha-us 10] [--pin 1] [--floor 1] [--perf build/perf/lowrank_allreduce_perf]
#     [--out studies/netns/results/netns_algorithms]
# writes OUT.json and OUT.md (studies/netns/algorithms_report.py). Namespaces are removed on exit.
set -u -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORLDS=4,8,16
DELAYS=0.25ms,1ms
RATES=100mbit,1gbit
ALGOS=ring,halving_doubling,recursive_doubling,direct,auto
REPS=3
GROUPS_=256:16K:40:5,64K:256K:10:2,1M:4M:3:1  # 16K: issue 40's 16-host target point
SWALPHA=10
PIN=1
FLOOR=1
PERF=$ROOT/build/perf/lowrank_allreduce_perf
OUT=$HERE/results/netns_algorithms
PY=/usr/bin/python3
CMDLINE="$0 $*"
while [ $# -gt 0 ]; do
  case $1 in
    --worlds) WORLDS=$2; shift 2 ;;
    --delays) DELAYS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --groups) GROUPS_=$2; shift 2 ;;
    --sw-alpha-us) SWALPHA=$2; shift 2 ;;
    --pin) PIN=$2; shift 2 ;;
    --floor) FLOOR=$2; shift 2 ;;
    --perf) PERF=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "netns_algorithms.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "netns_algorithms.sh: needs root (ip netns, tc)" >&2; exit 2; }
[ -x "$PERF" ] || { echo "netns_algorithms.sh: no perf binary at $PERF" >&2; exit 2; }
PERF=$(cd "$(dirname "$PERF")" && pwd)/$(basename "$PERF")
MODEL=$(dirname "$PERF")/lowrank_cost_model  # the transport's own formula: what auto chose
[ -x "$MODEL" ] || { echo "netns_algorithms.sh: no $MODEL beside the perf binary" >&2; exit 2; }
CORES=$(nproc)

WORK=$(mktemp -d)
HOSTS_PY=$PY
. "$ROOT/studies/lib/netns_hosts.sh"
trap 'hosts_down; rm -rf "$WORK"' EXIT
trap 'echo "netns_algorithms.sh: interrupted" >&2; exit 130' INT TERM

# fail before hours of runs if a delay cannot be made here (HOSTS_LINK=tbf-legacy on a kernel
# without netem)
if [ -n "$(echo "${DELAYS//,/ }" | tr ' ' '\n' | grep -v '^0\(ms\|us\)\?$')" ]; then
  hosts_up 2 || exit 1
  hosts_delay 1ms || exit 2
  hosts_down
fi
# calibrate N DELAY RATE: the links checked before any run over them (refused: exit 1)
# (a setting whose links fail every attempt is refused: not swept, named in the report, exit 1 at
# the end; the other settings go on)
calibrate() {
  local f=$WORK/calib.n$1.d$2.r$3.json rc=0
  PYTHONPATH=$ROOT "$PY" -m studies.lib.calibrate --tag $HOSTS_TAG --hosts $1 --out "$f" | sed 's/^/# /' || rc=1
  [ -f "$f" ] && echo "$f" >>"$WORK/calibs.txt"  # none when a helper could not even start
  [ $rc = 0 ] ||
    { echo "netns_algorithms.sh: the links ($1 hosts, $3, $2) failed their calibration: setting refused" >&2
      echo "$1 $2 $3" >>"$WORK/refused.txt"; return 1; }
}

# delay in microseconds (0.25ms -> 250)
us() { "$PY" -c "import re; m=re.fullmatch(r'([0-9.]+)(ms|us)?','$1'); print(float(m.group(1))*(1000 if m.group(2)=='ms' else 1))"; }

# run TAG N ALGO ALPHA BETA B E ITERS WARMUP: one perf process per host; rank r's JSON in $WORK/TAG.r<r>.json
run() {
  local tag=$1 n=$2 algo=$3 alpha=$4 beta=$5 b=$6 e=$7 it=$8 wu=$9
  local port=$((20000 + RANDOM % 12000)) pids=() i rc=0 pin model=()
  # auto: the default, the links measured when the communicator is made (LOWRANK_UCX_PROBE=1);
  # MODEL_AUTO=1: the model at the link's own figures instead (the sweep before issue 40's probe)
  [ "$algo" = auto ] && [ "${MODEL_AUTO:-0}" = 1 ] && model=(LOWRANK_UCX_ALPHA_US=$alpha LOWRANK_UCX_BETA_NS=$beta LOWRANK_UCX_OVERHEAD_US=0)
  for i in $(seq 0 $((n - 1))); do
    pin=(); [ "$PIN" = 1 ] && pin=(taskset -c $((i % CORES)))
    hosts_exec $i "${pin[@]}" env RANK=$i WORLD_SIZE=$n MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      LOWRANK_SOCKET_IFNAME=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 LOWRANK_UCX_ALGO=$algo \
      LOWRANK_UCX_PROBE=1 "${model[@]}" \
      timeout 3600 "$PERF" -t 1 -M exact -b $b -e $e -f 4 -n $it -w $wu --rounds 1 --phases 0 \
      --triad-mib 0 -J "$WORK/$tag.r$i.json" >"$WORK/$tag.o$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || rc=1; done
  [ $rc = 0 ] || { echo "netns_algorithms.sh: $tag failed; rank 0's last lines:" >&2; tail -5 "$WORK/$tag.o0" >&2; }
  # what the transport measured and chose (lowrankCommGetTransportInfo, rank 0's exact comm)
  grep -m1 '^# transport (exact comm' "$WORK/$tag.o0" | sed 's/^[^{]*//' >"$WORK/$tag.transport"
  return $rc
}

# sweep N DELAY RATE ALGOS: all repetitions of one link setting, the algorithms interleaved
sweep() {
  local n=$1 delay=$2 rate=$3 algos=($(echo ${4//,/ })) rep j a g tag alpha beta t0
  alpha=$("$PY" -c "print($(us $delay) + $SWALPHA)")
  beta=$([ "$rate" = none ] && echo 0.08 || "$PY" -c "print(8e9 / $(_hosts_bits $rate))")
  for rep in $(seq 1 $REPS); do
    for j in $(seq 0 $((${#algos[@]} - 1))); do
      a=${algos[$(( (j + rep - 1) % ${#algos[@]} ))]}  # rotated: no algorithm always runs first
      for g in ${GROUPS_//,/ }; do
        IFS=: read -r b e it wu <<<"$g"
        tag=n$n.d$delay.r$rate.rep$rep.$a.$b-$e
        t0=$(date +%s.%N)
        run $tag $n $a $alpha $beta $b $e $it $wu &&
          echo "$n $delay $rate $rep $a $alpha $beta $it $(date +%s.%N | "$PY" -c "import sys; print(round(float(sys.stdin.read()) - $t0, 2))") $WORK/$tag" >>"$WORK/runs.txt"
      done
    done
  done
}

echo "# netns_algorithms: $(date -Is), $CORES cores, worlds $WORLDS, delays $DELAYS, rates $RATES, $REPS reps; load $(cut -d' ' -f1-3 /proc/loadavg)"
SRC=$(git -C "$(dirname "$PERF")" rev-parse --show-toplevel 2>/dev/null)
GIT="$(git -C "$SRC" log --oneline -1 2>/dev/null)$([ -n "$(git -C "$SRC" status --porcelain -uno 2>/dev/null)" ] && echo ' (tree modified)')"
GIT="$GIT; binary $PERF built $(date -r "$PERF" -Is)"
echo "# binary: $GIT"
PYPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the studies package, for provenance and the report
PYTHONPATH=$PYPATH "$PY" -m studies.lib.provenance start --binary "$PERF" >"$WORK/provenance.json" || exit 1
: >"$WORK/runs.txt"
: >"$WORK/calibs.txt"
: >"$WORK/refused.txt"
T0=$(date +%s)
for n in ${WORLDS//,/ }; do
  hosts_up $n || exit 1
  if [ "$FLOOR" = 1 ]; then  # the CPU floor: no qdisc, same runs; auto's floor is its choice's, so
    hosts_unshape            # with auto every forced algorithm gets one
    FA=$(echo ${ALGOS//,/ } | tr ' ' '\n' | grep -vx auto | paste -sd,)
    [[ ,$ALGOS, == *,auto,* ]] && FA=ring,halving_doubling,recursive_doubling,direct
    echo "# $n hosts, no qdisc (CPU floor)"
    sweep $n 0 none $FA
  fi
  for rate in ${RATES//,/ }; do
    hosts_shape $rate >/dev/null || exit 1
    for delay in ${DELAYS//,/ }; do
      hosts_delay $delay || exit 1
      echo "# $n hosts, $rate, one-way delay $delay, link $(hosts_link) ($(($(date +%s) - T0)) s so far)"
      calibrate $n $delay $rate && sweep $n $delay $rate $ALGOS
    done
  done
  hosts_down
done
echo "# sweep done in $(($(date +%s) - T0)) s"
mkdir -p "$(dirname "$OUT")"
PYTHONPATH=$PYPATH "$PY" -m studies.netns.algorithms_report "$WORK/runs.txt" "$OUT" "$MODEL" "$CORES" "$GIT" "$CMDLINE" "$(date -Is)" \
  "$WORK/provenance.json"
rc=$?
PYTHONPATH=$PYPATH "$PY" -c 'import sys; from studies.lib.calibrate import attach; attach(sys.argv[1], sys.argv[2:])' \
  "$OUT.json" $(cat "$WORK/calibs.txt") || exit 1
if [ -s "$WORK/refused.txt" ]; then
  echo "netns_algorithms.sh: settings refused by their calibration (not swept): $(paste -sd';' "$WORK/refused.txt")" | tee -a "$OUT.md" >&2
  exit 1
fi
exit $rc
