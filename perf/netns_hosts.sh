# netns_hosts.sh (sourced): N "hosts" on one machine, network namespaces on a bridge, each link
# shaped to a known rate. Shared by perf/netns_bench.sh and perf/train/time_study.py, so that both
# measure over the same links (perf/train/time_study.py calls these functions through bash).
#
#   . perf/netns_hosts.sh
#   hosts_up N            # namespaces ${HOSTS_TAG}h0..h(N-1), addresses 10.77.0.1..N/24 on eth0
#   hosts_down            # removes them (the caller's EXIT trap should call it)
#   hosts_shape RATE      # tbf at RATE (e.g. 100mbit, 1gbit) on both ends of every link; prints bit/s
#   hosts_exec I CMD...   # CMD inside host I
# Why both ends: the host's egress shapes what it sends, the bridge port's egress what it receives,
# so a host's link is RATE in each direction, as a full-duplex NIC is. Needs root and iproute2.
# From the environment, a driver in another language can address hosts made by an earlier call:
# HOSTS_TAG=t HOSTS_N=4 bash -c '. perf/netns_hosts.sh; hosts_down'
HOSTS_N=${HOSTS_N:-0}
HOSTS_TAG=${HOSTS_TAG:-lrn$$}
HOSTS_PY=${HOSTS_PY:-/usr/bin/python3}

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
  local rate=$1 bits burst i
  bits=$("$HOSTS_PY" -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'.lower()); print(int(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]))") ||
    { echo "netns_hosts: bad rate $rate (e.g. 100mbit, 1gbit)" >&2; return 2; }
  burst=$(( bits / 8 / 100 )); [ $burst -lt 524288 ] && burst=524288
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns exec ${HOSTS_TAG}h$i tc qdisc replace dev eth0 root tbf rate $rate burst $burst latency 200ms || return 1
    tc qdisc replace dev ${HOSTS_TAG}v$i root tbf rate $rate burst $burst latency 200ms || return 1
  done
  echo "$bits"
}

hosts_exec() {
  local i=$1
  shift
  ip netns exec ${HOSTS_TAG}h$i "$@"
}
