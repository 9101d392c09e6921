# netns_hosts.sh (sourced): N "hosts" on one machine, network namespaces on a bridge, each link
# shaped to a known rate. Shared by studies/netns/bench.sh and studies/time/run.py, so that both
# measure over the same links (studies/time/run.py calls these functions through bash).
#
#   . studies/lib/netns_hosts.sh
#   hosts_up N            # namespaces ${HOSTS_TAG}h0..h(N-1), addresses 10.77.0.1..N/24 on eth0
#   hosts_down            # removes them (the caller's EXIT trap should call it)
#   hosts_shape RATE      # tbf at RATE (e.g. 100mbit, 1gbit) on both ends of every link; prints bit/s
#   hosts_delay DELAY     # netem one-way delay DELAY (e.g. 250us, 1ms; 0: none), kept with the rate
#   hosts_unshape         # no qdisc at all (the kernel's default): neither rate nor delay
#   hosts_exec I CMD...   # CMD inside host I
# Why both ends: the host's egress shapes what it sends, the bridge port's egress what it receives,
# so a host's link is RATE in each direction, as a full-duplex NIC is. Needs root and iproute2.
# The delay sits on the bridge port's egress only (toward the host), as netem root with the tbf as
# its child (netem holds each packet DELAY, then the tbf paces it at RATE). Every packet crosses
# exactly one bridge port toward its destination, so each direction gets DELAY once: one-way delay =
# DELAY, round trip = 2 DELAY. Not on the host's side: there a packet still belongs to its socket,
# and TCP small queues would count the delayed bytes against the sender.
# hosts_shape and hosts_delay each keep the other's setting (HOSTS_RATE, HOSTS_DELAY; a driver in
# another shell passes them in the environment); without a delay hosts_shape does what it always did.
# From the environment, a driver in another language can address hosts made by an earlier call:
# HOSTS_TAG=t HOSTS_N=4 bash -c '. studies/lib/netns_hosts.sh; hosts_down'
HOSTS_N=${HOSTS_N:-0}
HOSTS_TAG=${HOSTS_TAG:-lrn$$}
HOSTS_PY=${HOSTS_PY:-/usr/bin/python3}
HOSTS_RATE=${HOSTS_RATE:-}
HOSTS_DELAY=${HOSTS_DELAY:-}

hosts_down() {
  local i
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns pids ${HOSTS_TAG}h$i 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del ${HOSTS_TAG}h$i 2>/dev/null
  done
  ip link del ${HOSTS_TAG}br 2>/dev/null
  HOSTS_N=0
}

hosts_up() {
  local n=$1 i ns br=${HOSTS_TAG}br
  [ "$(id -u)" = 0 ] || { echo "netns_hosts: needs root (ip netns, tc)" >&2; return 2; }
  command -v tc >/dev/null && command -v ip >/dev/null || { echo "netns_hosts: needs iproute2" >&2; return 2; }
  ip link add $br type bridge || { echo "netns_hosts: cannot make a bridge" >&2; return 1; }
  ip link set $br up
  HOSTS_N=$n
  for i in $(seq 0 $((n - 1))); do
    ns=${HOSTS_TAG}h$i
    ip netns add $ns || return 1
    ip link add ${HOSTS_TAG}v$i type veth peer name eth0 netns $ns || return 1
    ip link set ${HOSTS_TAG}v$i master $br up
    ip -n $ns addr add 10.77.0.$((i + 1))/24 dev eth0
    ip -n $ns link set eth0 up
    ip -n $ns link set lo up
  done
}

# burst: at least one timer tick (10 ms) of data, and 512 KiB, so that tbf itself adds no stall
hosts_shape() {
  local rate=$1 bits
  bits=$(_hosts_bits $rate) || { echo "netns_hosts: bad rate $rate (e.g. 100mbit, 1gbit)" >&2; return 2; }
  HOSTS_RATE=$rate
  _hosts_qdiscs || return 1
  echo "$bits"
}

hosts_delay() {
  case $1 in
    0|0ms|0us|'') HOSTS_DELAY= ;;
    *[0-9]ms|*[0-9]us) HOSTS_DELAY=$1 ;;
    *) echo "netns_hosts: bad delay $1 (e.g. 250us, 0.25ms, 1ms)" >&2; return 2 ;;
  esac
  # probe on host 0's loopback (unused) first, so that a kernel without netem leaves the links as they were
  if [ -n "$HOSTS_DELAY" ] && ! hosts_exec 0 tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    echo "netns_hosts: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem): no delay here" >&2
    HOSTS_DELAY=
    return 3
  fi
  [ -z "$HOSTS_DELAY" ] || hosts_exec 0 tc qdisc del dev lo root
  _hosts_qdiscs
}

hosts_unshape() {
  local i
  HOSTS_RATE= HOSTS_DELAY=
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns exec ${HOSTS_TAG}h$i tc qdisc del dev eth0 root 2>/dev/null
    tc qdisc del dev ${HOSTS_TAG}v$i root 2>/dev/null
  done
  return 0
}

_hosts_bits() {  # 100mbit -> 100000000
  "$HOSTS_PY" -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$1'.lower()); print(int(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]))" 2>/dev/null
}

# (re)writes every link's qdiscs from HOSTS_RATE and HOSTS_DELAY
_hosts_qdiscs() {
  local i v tbf="" burst bits
  if [ -n "$HOSTS_RATE" ]; then
    bits=$(_hosts_bits $HOSTS_RATE) || return 2
    burst=$(( bits / 8 / 100 )); [ $burst -lt 524288 ] && burst=524288
    tbf="tbf rate $HOSTS_RATE burst $burst latency 200ms"
  fi
  for i in $(seq 0 $((HOSTS_N - 1))); do
    v=${HOSTS_TAG}v$i
    if [ -n "$tbf" ]; then
      ip netns exec ${HOSTS_TAG}h$i tc qdisc replace dev eth0 root $tbf || return 1
    else
      ip netns exec ${HOSTS_TAG}h$i tc qdisc del dev eth0 root 2>/dev/null
    fi
    if [ -z "$HOSTS_DELAY" ] && [ -n "$tbf" ]; then
      tc qdisc replace dev $v root $tbf || return 1  # as before hosts_delay existed
    elif [ -z "$HOSTS_DELAY" ]; then
      tc qdisc del dev $v root 2>/dev/null
    else
      # a root of another kind cannot be replaced in place with a child under it: start afresh.
      # limit: netem's queue holds every packet in flight for DELAY (default 1000 packets is short
      # of N-1 senders at 1 Gbit/s into one port for 1 ms)
      tc qdisc del dev $v root 2>/dev/null
      tc qdisc add dev $v root handle 1: netem delay $HOSTS_DELAY limit 100000 || return 1
      [ -z "$tbf" ] || tc qdisc add dev $v parent 1:1 handle 10: $tbf || return 1
    fi
  done
  return 0
}

hosts_exec() {
  local i=$1
  shift
  ip netns exec ${HOSTS_TAG}h$i "$@"
}
