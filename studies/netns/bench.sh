#!/usr/bin/env bash
# netns_bench.sh: lowrank across four "hosts" on one machine, over links of a known rate.
#
# Makes four network namespaces (the hosts, addresses 10.77.0.1-4/24) joined by links that pace
# like a wire at each rate and delay each packet by --delay one way (studies/lib/netns_hosts.sh:
# netem where the kernel has it, else the user-space wire; HOSTS_LINK=tbf-legacy for the old tbf
# links; hosts_shape then hosts_delay), calibrates the links at each rate and that delay
# (studies/lib/calibrate.py; a rate whose calibration fails stops the run, exit status 1; the
# calibrations go into OUT.json as "calibration"), and runs lowrank_allreduce_perf as one process per
# host, started with a launcher's variables
# (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), LOWRANK_SOCKET_IFNAME and UCX_TLS=tcp,self,
# UCX_NET_DEVICES=<the host's veth> so that no shared-memory or loopback path bypasses the links.
# Gradients: ResNet-50 layer shapes, synthetic with a decaying spectrum (studies/lib/gradsets.py).
# Per rate: exact twice, as the library chooses its host allreduce (LOWRANK_UCX_ALGO unset, the links
# probed when the communicator is made: LOWRANK_UCX_PROBE=1), with fp16 in the same run, and with
# LOWRANK_UCX_ALGO=ring; then powersgd (as chosen) for each k and each LOWRANK_PIPELINE value.
#
# Reported per row (studies/netns/report.py): time per call (rank 0, out-of-place, the slowest rank),
# speedup over the faster of the two exact runs (the baseline; the report names it), compute_us and
# comm_us (each phase alone), and the bound on the speedup:
#   bound = exact time / max(compute floor, compressed wire time)
#   compressed wire time = ring bytes of the payload / link rate = 2 (N-1)/N * payload bytes / rate
#   compute floor = bytes the compression must move / the triad bandwidth one process gets while
#     all four run it at once (they share this machine's cores): the perf binary's bound_us;
#   bound (own cores): the same with each host's triad alone (hosts with their own cores).
# CHECK: the baseline exact's busbw must come within 10% of the link's TCP goodput (rate * 1448/1514).
# Above it, the links were bypassed (the numbers are void: exit status 1); below it, the machine
# cannot drive the link (said loudly).
#
# usage (root): studies/netns/bench.sh [--rates 100mbit,1gbit,10gbit] [--delay 250us] [--ks 1,2,4]
#                                   [--pipeline 0,1] [--perf build/perf/lowrank_allreduce_perf]
#                                   [--out FILE_PREFIX] [--gradients DIR] [--iters N] [--fp16 0|1]
# --delay: one way (250us as the switching study; 0: none), e.g. 250us, 0.25ms, 1ms.
# writes FILE_PREFIX.json and FILE_PREFIX.md (default studies/netns/results/wire_netns; the netns*
# files there are the runs on the tbf links before issue 40). Namespaces and links are removed on
# exit, also on failure or Ctrl-C.
set -u -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RATES=100mbit,1gbit,10gbit
DELAY=250us
KS=1,2,4
PIPES=0,1
PERF=$ROOT/build/perf/lowrank_allreduce_perf
OUT=$HERE/results/wire_netns
GDIR=
ITERS=3
FP16=1
PY=/usr/bin/python3
while [ $# -gt 0 ]; do
  case $1 in
    --rates) RATES=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --ks) KS=$2; shift 2 ;;
    --pipeline) PIPES=$2; shift 2 ;;
    --perf) PERF=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --gradients) GDIR=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --fp16) FP16=$2; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "netns_bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "netns_bench.sh: needs root (ip netns, tc)" >&2; exit 2; }
[ -x "$PERF" ] || { echo "netns_bench.sh: no perf binary at $PERF (ninja -C build)" >&2; exit 2; }
PERF=$(cd "$(dirname "$PERF")" && pwd)/$(basename "$PERF")
command -v tc >/dev/null && command -v ip >/dev/null || { echo "netns_bench.sh: needs iproute2" >&2; exit 2; }

if [ -z "$GDIR" ]; then
  GDIR=${TMPDIR:-/tmp}/lowrank-gradsets/resnet50
  "$PY" "$ROOT/studies/lib/gradsets.py" resnet50 "$GDIR" 4 >/dev/null || { echo "netns_bench.sh: cannot make the gradients" >&2; exit 1; }
fi

N=4
WORK=$(mktemp -d)
HOSTS_PY=$PY
. "$ROOT/studies/lib/netns_hosts.sh"  # the hosts and their links, shared with the time, switch and tta studies
trap 'hosts_down; rm -rf "$WORK"' EXIT
trap 'echo "netns_bench.sh: interrupted" >&2; exit 130' INT TERM
hosts_up $N || exit 1
shape() { hosts_shape "$@" || exit 1; }
# calibrate RATE: the links checked before any run over them (refused: exit 1)
calibrate() {
  PYTHONPATH=$ROOT "$PY" -m studies.lib.calibrate --tag $HOSTS_TAG --hosts $N --out "$WORK/calib.$1.json" |
    sed 's/^/# /' || { echo "netns_bench.sh: the links at $1 failed their calibration: run refused" >&2; exit 1; }
  echo "$WORK/calib.$1.json" >>"$WORK/calibs.txt"
}

# run NAME PIPELINE ALGO ARGS...: one perf process per host; rank r's JSON in $WORK/NAME.r<r>.json,
# its output in $WORK/NAME.o<r>. ALGO: chosen (the library's own choice, the links probed: the
# caller's LOWRANK_UCX_ALGO dropped) or a host allreduce forced through LOWRANK_UCX_ALGO (ring),
# read when each communicator is made.
run() {
  local name=$1 pipe=$2 algo=$3; shift 3
  local port=$((20000 + RANDOM % 12000)) pids=() i rc=0 how
  if [ "$algo" = chosen ]; then how=(-u LOWRANK_UCX_ALGO LOWRANK_UCX_PROBE=1); else how=(LOWRANK_UCX_ALGO=$algo); fi
  for i in $(seq 0 $((N - 1))); do
    hosts_exec $i env "${how[@]}" RANK=$i WORLD_SIZE=$N MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      LOWRANK_SOCKET_IFNAME=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 LOWRANK_PIPELINE=$pipe \
      timeout 1200 "$PERF" -t 1 --gradients "$GDIR" --step synth "$@" -J "$WORK/$name.r$i.json" \
      >"$WORK/$name.o$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || rc=1; done
  if [ $rc != 0 ]; then
    echo "netns_bench.sh: $name failed; rank 0's last lines:" >&2; tail -5 "$WORK/$name.o0" >&2
  fi
  grep -v '^#  Rank' "$WORK/$name.o0" | sed -n '/^# *size/,$p' | head -8
  return $rc
}

echo "# netns_bench: $(date -Is), $(nproc) cores, $N hosts, delay $DELAY one way; perf $PERF; gradients $GDIR;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
GIT0=$(git -C "$ROOT" log --oneline -1 2>/dev/null)
LIB0=$(ls -l --time-style=+%s "$(dirname "$PERF")/../liblowrank.so"* 2>/dev/null | md5sum | cut -c1-8)
echo "# lowrank: $GIT0"
PYPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the studies package, for provenance and the report
PYTHONPATH=$PYPATH "$PY" -m studies.lib.provenance start --binary "$PERF" >"$WORK/provenance.json" || exit 1
: >"$WORK/runs.txt"
: >"$WORK/calibs.txt"
for rate in ${RATES//,/ }; do
  bits=$(shape $rate) || exit 1
  hosts_delay "$DELAY" || exit 1  # kept with the rate; before the calibration, which checks both
  echo "# ---- $rate ($bits bit/s, $DELAY one way, link $(hosts_link))"
  calibrate $rate
  # exact as chosen (with fp16, once) and with the ring: the report takes the faster as the baseline
  run "$rate.exact" 1 chosen --mode exact$([ "$FP16" = 1 ] && echo ,fp16) -k 0 -n $ITERS -w 1 --rounds 1 &&
    echo "$rate $bits exact - $WORK/$rate.exact.r0.json chosen $WORK/$rate.exact.o0" >>"$WORK/runs.txt"
  run "$rate.exactring" 1 ring --mode exact -k 0 -n $ITERS -w 1 --rounds 1 &&
    echo "$rate $bits exact - $WORK/$rate.exactring.r0.json ring $WORK/$rate.exactring.o0" >>"$WORK/runs.txt"
  for pipe in ${PIPES//,/ }; do
    for k in ${KS//,/ }; do
      name=$rate.k$k.p$pipe
      run $name $pipe chosen --mode powersgd -k $k -n $((ITERS + 2)) -w 1 --rounds 3 &&
        echo "$rate $bits powersgd $pipe $WORK/$name.r0.json chosen $WORK/$name.o0" >>"$WORK/runs.txt"
    done
  done
done

mkdir -p "$(dirname "$OUT")"
GITINFO=$GIT0
if [ "$(ls -l --time-style=+%s "$(dirname "$PERF")/../liblowrank.so"* 2>/dev/null | md5sum | cut -c1-8)" != "$LIB0" ]; then
  echo "netns_bench.sh: WARNING: the library was rebuilt during the run (now at $(git -C "$ROOT" log --oneline -1)): rows may come from two builds" >&2
  GITINFO="$GIT0 (library REBUILT during the run, now $(git -C "$ROOT" log --oneline -1 | cut -c1-7))"
fi
PYTHONPATH=$PYPATH "$PY" -m studies.netns.report runs "$WORK/runs.txt" "$OUT" "$N" "$(date -Is)" "$(nproc)" "$GITINFO" "$GDIR" \
  "$WORK/provenance.json" --delay "$DELAY" --link "$(hosts_link)"
rc=$?
PYTHONPATH=$PYPATH "$PY" -c 'import sys; from studies.lib.calibrate import attach; attach(sys.argv[1], sys.argv[2:])' \
  "$OUT.json" $(cat "$WORK/calibs.txt") || exit 1
exit $rc
