# netns_hosts.sh (sourced): N "hosts" on one machine, network namespaces joined by links that delay
# and pace like a wire. Shared by studies/netns/*.sh and, through studies/lib/hosts.py, the time,
# switch and tta studies, so that all measure over the same links.
#
#   . studies/lib/netns_hosts.sh
#   hosts_up N            # namespaces ${HOSTS_TAG}h0..h(N-1), addresses 10.77.0.1..N/24 on eth0
#   hosts_down            # removes them (the caller's EXIT trap should call it)
#   hosts_shape RATE      # every link at RATE (e.g. 100mbit, 1gbit) each way; prints bit/s
#   hosts_delay DELAY     # one-way delay DELAY (e.g. 250us, 0.25ms, 1ms; 0: none), kept with the rate
#   hosts_unshape         # neither rate nor delay
#   hosts_link            # prints the kind of link in use: wire, netem or tbf-legacy
#   hosts_settings        # prints "KIND RATE_BIT_PER_S DELAY_NS" (0: none), what calibrate.py checks
#   hosts_link_stats      # the wire's counters since the previous call (its status line), else ""
#   hosts_loss P          # every link loses each frame with probability P (0 <= P < 1; 0.01: 1%)
#   hosts_cut I           # host I's link cut: nothing in or out (a pulled cable)
#   hosts_heal I          # host I's link mended (-1: every host's)
#   hosts_exec I CMD...   # CMD inside host I
#   hosts_wire_bin        # prints the path of the user-space link's program (built on first use)
#
# The kind of link, HOSTS_LINK (read by hosts_up):
#   auto (default)  netem where the kernel has it (sch_netem), else wire.
#   wire            studies/lib/wire/wire.cc: one TAP per host (its eth0) and one user-space thread
#                   that switches frames between them; each frame is paced at the rate leaving its
#                   sender, delayed, and paced at the rate into its receiver (netem then a rate
#                   limiter on both ends, in order, no drops, no burst). Compiled with ${CXX:-g++}
#                   -O2 on first use into ${HOSTS_WIRE_CACHE:-~/.cache/lowrank-wire}, keyed by the
#                   source's hash. Rate 0 and delay 0 still go through it (a plain switch).
#   netem           a veth pair per host on a bridge; netem's own rate (which paces each packet,
#                   no burst) on both ends and the delay on the bridge port's egress (toward the
#                   host), offloads off where ethtool is there so that every frame is counted.
#   tbf-legacy      the links before issue 40: tbf with a burst of max(512 KiB, rate x 10 ms) on
#                   both ends, delay by netem only. That burst let every message under half a
#                   megabyte cross at memory speed after an idle gap: kept only to reproduce old
#                   figures, never the default.
# Whatever the kind, check the links with studies/lib/calibrate.py before measuring over them.
# The delay sits where a packet no longer belongs to its socket (TCP small queues would otherwise
# count the delayed bytes against the sender); every packet crosses the delay once, so round trip =
# 2 DELAY. Needs root and iproute2; the wire needs /dev/net/tun and a C++17 compiler.
#
# State (the kind, rate, delay, the wire's pid and control FIFO) lives in HOSTS_STATE (default
# ${TMPDIR:-/tmp}/lowrank-hosts-$HOSTS_TAG), so a driver in another language, calling each
# function in a new shell with the same HOSTS_TAG and HOSTS_N, addresses the hosts made earlier:
# HOSTS_TAG=t HOSTS_N=4 bash -c '. studies/lib/netns_hosts.sh; hosts_down'
HOSTS_N=${HOSTS_N:-0}
HOSTS_TAG=${HOSTS_TAG:-lrn$$}
HOSTS_PY=${HOSTS_PY:-/usr/bin/python3}
HOSTS_LINK=${HOSTS_LINK:-auto}
HOSTS_STATE=${HOSTS_STATE:-${TMPDIR:-/tmp}/lowrank-hosts-$HOSTS_TAG}
HOSTS_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$HOSTS_N" != 0 ] || [ ! -f "$HOSTS_STATE/n" ] || HOSTS_N=$(cat "$HOSTS_STATE/n")

hosts_down() {
  local i pid
  if [ -f "$HOSTS_STATE/wire.pid" ]; then
    pid=$(cat "$HOSTS_STATE/wire.pid")
    kill "$pid" 2>/dev/null
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns pids ${HOSTS_TAG}h$i 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del ${HOSTS_TAG}h$i 2>/dev/null
  done
  ip link del ${HOSTS_TAG}br 2>/dev/null
  rm -rf "$HOSTS_STATE"
  HOSTS_N=0
}

hosts_up() {
  local n=$1 i ns kind
  [ "$(id -u)" = 0 ] || { echo "netns_hosts: needs root (ip netns, tc)" >&2; return 2; }
  command -v tc >/dev/null && command -v ip >/dev/null || { echo "netns_hosts: needs iproute2" >&2; return 2; }
  case $HOSTS_LINK in
    auto) if _hosts_have_netem; then kind=netem; else kind=wire; fi ;;
    wire|netem|tbf-legacy) kind=$HOSTS_LINK ;;
    *) echo "netns_hosts: HOSTS_LINK=$HOSTS_LINK: want auto, wire, netem or tbf-legacy" >&2; return 2 ;;
  esac
  if [ $kind = netem ] && ! _hosts_have_netem; then
    echo "netns_hosts: HOSTS_LINK=netem but this kernel has no netem qdisc (sch_netem)" >&2; return 2
  fi
  mkdir -p "$HOSTS_STATE" && echo $kind >"$HOSTS_STATE/link" || return 1
  echo "${HOSTS_RATE:-}" >"$HOSTS_STATE/rate"
  echo "${HOSTS_DELAY:-}" >"$HOSTS_STATE/delay"
  HOSTS_N=$n
  echo $n >"$HOSTS_STATE/n"
  for i in $(seq 0 $((n - 1))); do
    ns=${HOSTS_TAG}h$i
    ip netns add $ns || return 1
    # no IPv6: its router and listener chatter would share the links with the measurement
    ip netns exec $ns sh -c 'for f in all default; do echo 1 >/proc/sys/net/ipv6/conf/$f/disable_ipv6; done' 2>/dev/null
    ip -n $ns link set lo up
  done
  if [ $kind = wire ]; then
    _hosts_wire_start || return 1
  else
    ip link add ${HOSTS_TAG}br type bridge || { echo "netns_hosts: cannot make a bridge" >&2; return 1; }
    ip link set ${HOSTS_TAG}br up
    for i in $(seq 0 $((n - 1))); do
      ip link add ${HOSTS_TAG}v$i type veth peer name eth0 netns ${HOSTS_TAG}h$i || return 1
      ip link set ${HOSTS_TAG}v$i master ${HOSTS_TAG}br up
      if [ $kind = netem ] && command -v ethtool >/dev/null; then  # one frame, one count
        ethtool -K ${HOSTS_TAG}v$i tso off gso off gro off >/dev/null 2>&1
        ip netns exec ${HOSTS_TAG}h$i ethtool -K eth0 tso off gso off gro off >/dev/null 2>&1
      fi
    done
  fi
  for i in $(seq 0 $((n - 1))); do
    ip -n ${HOSTS_TAG}h$i addr add 10.77.0.$((i + 1))/24 dev eth0 || return 1
    ip -n ${HOSTS_TAG}h$i link set eth0 up || return 1
  done
  _hosts_apply
}

hosts_link() { cat "$HOSTS_STATE/link" 2>/dev/null || { echo "netns_hosts: no hosts up (tag $HOSTS_TAG)" >&2; return 1; }; }

hosts_settings() {
  local kind rate delay bits=0
  kind=$(hosts_link) || return 1
  rate=$(cat "$HOSTS_STATE/rate") delay=$(cat "$HOSTS_STATE/delay")
  [ -z "$rate" ] || bits=$(_hosts_bits $rate) || return 2
  echo "$kind $bits $(_hosts_ns "$delay")"
}

hosts_link_stats() {
  [ "$(hosts_link)" = wire ] || return 0
  _hosts_wire_ctl "" && cat "$HOSTS_STATE/status"
}

hosts_shape() {
  local bits
  bits=$(_hosts_bits "$1") || { echo "netns_hosts: bad rate $1 (e.g. 100mbit, 1gbit)" >&2; return 2; }
  echo "$1" >"$HOSTS_STATE/rate" || return 1
  _hosts_apply || return 1
  echo "$bits"
}

hosts_delay() {
  local d
  case $1 in
    0|0ms|0us|'') d= ;;
    *[0-9]ms|*[0-9]us) d=$1 ;;
    *) echo "netns_hosts: bad delay $1 (e.g. 250us, 0.25ms, 1ms)" >&2; return 2 ;;
  esac
  if [ -n "$d" ] && [ "$(hosts_link)" = tbf-legacy ] && ! _hosts_have_netem; then
    echo "netns_hosts: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem): no delay with HOSTS_LINK=tbf-legacy (HOSTS_LINK=wire delays without it)" >&2
    return 3
  fi
  echo "$d" >"$HOSTS_STATE/delay" || return 1
  _hosts_apply
}

# Faults (issue 42). The wire draws its losses from a seeded generator (hosts_loss resets it to
# HOSTS_LOSS_SEED, default 1), so a run's losses repeat with its arrivals; netem's are random.
hosts_loss() {
  "${HOSTS_PY:-python3}" -c "import sys; p = float(sys.argv[1]); sys.exit(not 0 <= p < 1)" "$1" 2>/dev/null ||
    { echo "netns_hosts: loss $1: want a probability in [0, 1)" >&2; return 2; }
  echo "$1" >"$HOSTS_STATE/loss" || return 1
  case $(hosts_link) in
    wire) _hosts_wire_ctl "loss $1 seed ${HOSTS_LOSS_SEED:-1}" ;;
    netem) _hosts_apply ;;  # rebuilt with the rate and delay kept
    *) echo "netns_hosts: no loss on $(hosts_link) links" >&2; return 2 ;;
  esac
}
hosts_cut() {
  case $(hosts_link) in
    wire) _hosts_wire_ctl "cut $1" ;;
    *) ip link set ${HOSTS_TAG}v$1 down ;;
  esac
}
hosts_heal() {
  case $(hosts_link) in
    wire) _hosts_wire_ctl "heal $1" ;;
    *) local i; for i in $( [ "$1" = -1 ] && seq 0 $((HOSTS_N - 1)) || echo $1); do
         ip link set ${HOSTS_TAG}v$i up; done ;;
  esac
}

hosts_unshape() {
  : >"$HOSTS_STATE/rate" && : >"$HOSTS_STATE/delay" && _hosts_apply
}

hosts_exec() {
  local i=$1
  shift
  ip netns exec ${HOSTS_TAG}h$i "$@"
}

hosts_wire_bin() {
  local src=$HOSTS_LIB_DIR/wire/wire.cc dir bin
  dir=${HOSTS_WIRE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/lowrank-wire}
  bin=$dir/wire-$(sha256sum "$src" | cut -c1-16)
  if [ ! -x "$bin" ]; then
    mkdir -p "$dir" || return 1
    ${CXX:-g++} -O2 -std=c++17 -o "$bin.$$" "$src" && mv -f "$bin.$$" "$bin" ||
      { echo "netns_hosts: cannot build $src with ${CXX:-g++}" >&2; rm -f "$bin.$$"; return 1; }
  fi
  echo "$bin"
}

_hosts_have_netem() {  # in a namespace of its own, so that nothing else is touched
  local ns=${HOSTS_TAG}probe ok=1
  ip netns add $ns 2>/dev/null || return 1
  ip netns exec $ns tc qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
  ip netns del $ns
  return $ok
}

_hosts_bits() {  # 100mbit -> 100000000
  "$HOSTS_PY" -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$1'.lower()); print(int(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]))" 2>/dev/null
}

_hosts_ns() {  # 0.25ms -> 250000; '' -> 0
  [ -z "$1" ] && { echo 0; return; }
  "$HOSTS_PY" -c "import re; m=re.fullmatch(r'([0-9.]+)(ms|us)','$1'); print(round(float(m.group(1))*(1e6 if m.group(2)=='ms' else 1e3)))" 2>/dev/null
}

_hosts_wire_start() {
  local bin i args=() pid
  [ -c /dev/net/tun ] || { echo "netns_hosts: HOSTS_LINK=wire needs /dev/net/tun" >&2; return 2; }
  bin=$(hosts_wire_bin) || return 1
  for i in $(seq 0 $((HOSTS_N - 1))); do args+=(--netns /run/netns/${HOSTS_TAG}h$i); done
  rm -f "$HOSTS_STATE/ctl" "$HOSTS_STATE/status"
  mkfifo "$HOSTS_STATE/ctl" || return 1
  echo 0 >"$HOSTS_STATE/gen"
  # its own session: outlives the shell that started it (hosts.py calls each function in a new
  # one) and a Ctrl-C of the driver; hosts_down ends it
  [ "${HOSTS_WIRE_NAPI:-1}" = 0 ] && args+=(--no-napi)
  setsid "$bin" "${args[@]}" --status "$HOSTS_STATE/status" --ctl "$HOSTS_STATE/ctl" \
    </dev/null >>"$HOSTS_STATE/wire.log" 2>&1 &
  pid=$!
  echo $pid >"$HOSTS_STATE/wire.pid"
  for i in $(seq 100); do
    [ -f "$HOSTS_STATE/status" ] && return 0
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  echo "netns_hosts: the wire did not start: $(cat "$HOSTS_STATE/wire.log")" >&2
  return 1
}

# The wire's TAPs take frames in through NAPI (wire.cc: IFF_NAPI). _hosts_wire_napi 1: each host's
# poll runs in a thread of its own (threaded NAPI), at real-time priority ${HOSTS_NAPI_RT:-30}
# (below the wire's 50, above calibrate.py's programs), as a NIC's receive work runs beside the
# programs on the host and before them (softirq); without it the wire's one thread runs every
# receiving host's TCP/IP stack inside its writes and, at 1 Gbit/s, releases late and paces bulk
# TCP below the rate (issue 40). _hosts_wire_napi 0: the poll runs inside the wire's writes, which
# saves two thread wake-ups a round trip (20-40 us each on these VMs: the 0.25 ms ping check's
# margin) and is quick enough below a few hundred Mbit/s. _hosts_apply takes 1 above 300 Mbit/s
# and without a rate, else 0. HOSTS_WIRE_NAPI=0: IFF_NAPI off, the stacks always inline.
_hosts_wire_napi() {
  local i pid before after
  before=$(pgrep -d' ' '^napi/' 2>/dev/null)
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns exec ${HOSTS_TAG}h$i sh -c "echo $1 >/sys/class/net/eth0/threaded" 2>/dev/null ||
      { echo "netns_hosts: this kernel has no threaded NAPI (/sys/class/net/eth0/threaded)" >&2; return 1; }
  done
  [ "$1" = 1 ] && [ "${HOSTS_NAPI_RT:-30}" -gt 0 ] || return 0
  after=$(pgrep '^napi/eth0' 2>/dev/null)
  for pid in $after; do
    case " $before " in *" $pid "*) continue ;; esac
    chrt -f -p ${HOSTS_NAPI_RT:-30} $pid >/dev/null 2>&1 || true  # unprivileged: timing suffers only
  done
}

# _hosts_wire_ctl WORDS: one control line to the wire ("gen G WORDS"), waits until it is taken
_hosts_wire_ctl() {
  local gen i
  gen=$(( $(cat "$HOSTS_STATE/gen") + 1 ))
  echo $gen >"$HOSTS_STATE/gen"
  # a FIFO's open blocks without a reader: never wait on a wire that died
  timeout 5 bash -c 'echo "$1" >"$2"' _ "gen $gen $1" "$HOSTS_STATE/ctl" ||
    { echo "netns_hosts: the wire is not running: $(tail -3 "$HOSTS_STATE/wire.log")" >&2; return 1; }
  for i in $(seq 250); do
    case $(cat "$HOSTS_STATE/status" 2>/dev/null) in "gen $gen "*) return 0 ;; esac
    sleep 0.02
  done
  echo "netns_hosts: the wire did not answer: $(tail -3 "$HOSTS_STATE/wire.log")" >&2
  return 1
}

# (re)applies the kind's link settings from the state's rate and delay
_hosts_apply() {
  local kind rate delay bits=0 ns=0 i v gen loss
  kind=$(hosts_link) || return 1
  rate=$(cat "$HOSTS_STATE/rate")
  delay=$(cat "$HOSTS_STATE/delay")
  [ -z "$rate" ] || bits=$(_hosts_bits $rate) || return 2
  ns=$(_hosts_ns "$delay") || return 2
  case $kind in
    wire)
      # the receiving hosts' stacks beside the wire's thread where the rate needs it (below)
      if [ "${HOSTS_WIRE_NAPI:-1}" != 0 ]; then
        _hosts_wire_napi $([ "$bits" = 0 ] || [ "$bits" -gt 300000000 ] && echo 1 || echo 0) || return 1
      fi
      _hosts_wire_ctl "rate $bits delay_ns $ns" ;;
    netem)
      for i in $(seq 0 $((HOSTS_N - 1))); do
        v=${HOSTS_TAG}v$i
        ip netns exec ${HOSTS_TAG}h$i tc qdisc del dev eth0 root 2>/dev/null
        tc qdisc del dev $v root 2>/dev/null
        # limit: netem holds every packet in flight (the default 1000 is short of N-1 senders
        # at 1 Gbit/s into one port for 1 ms)
        if [ -n "$rate" ]; then
          ip netns exec ${HOSTS_TAG}h$i tc qdisc add dev eth0 root netem rate $rate limit 100000 || return 1
        fi
        loss=$(cat "$HOSTS_STATE/loss" 2>/dev/null)
        [ "${loss:-0}" = 0 ] && loss= || loss=$("${HOSTS_PY:-python3}" -c "print(100 * $loss)")
        if [ -n "$rate$delay$loss" ]; then
          tc qdisc add dev $v root netem ${delay:+delay $delay} ${rate:+rate $rate} \
            ${loss:+loss ${loss}%} limit 100000 || return 1
        fi
      done ;;
    tbf-legacy) _hosts_tbf_legacy "$rate" "$delay" ;;
  esac
}

# the links before issue 40, unchanged: tbf, burst max(512 KiB, rate x 10 ms); netem for a delay
_hosts_tbf_legacy() {
  local rate=$1 delay=$2 i v tbf="" burst bits
  if [ -n "$rate" ]; then
    bits=$(_hosts_bits $rate) || return 2
    burst=$(( bits / 8 / 100 )); [ $burst -lt 524288 ] && burst=524288
    tbf="tbf rate $rate burst $burst latency 200ms"
  fi
  for i in $(seq 0 $((HOSTS_N - 1))); do
    v=${HOSTS_TAG}v$i
    if [ -n "$tbf" ]; then
      ip netns exec ${HOSTS_TAG}h$i tc qdisc replace dev eth0 root $tbf || return 1
    else
      ip netns exec ${HOSTS_TAG}h$i tc qdisc del dev eth0 root 2>/dev/null
    fi
    if [ -z "$delay" ] && [ -n "$tbf" ]; then
      tc qdisc replace dev $v root $tbf || return 1
    elif [ -z "$delay" ]; then
      tc qdisc del dev $v root 2>/dev/null
    else
      tc qdisc del dev $v root 2>/dev/null
      tc qdisc add dev $v root handle 1: netem delay $delay limit 100000 || return 1
      [ -z "$tbf" ] || tc qdisc add dev $v parent 1:1 handle 10: $tbf || return 1
    fi
  done
  return 0
}
