"""Bytes on the sockets, counted alike for every reducer (gloo's and lowrank's connections are
all TCP): what the kernel says was sent, not what a reducer says it sent.

- process(): this process's own TCP sockets, by getsockopt(TCP_INFO) on each of its descriptors:
  tcpi_bytes_sent (payload bytes transmitted, retransmissions included; Linux >= 4.19) and
  tcpi_bytes_acked (payload bytes the peer acknowledged), tcpi_bytes_retrans (of the sent, those
  sent again). No root, no tool, and on loopback it is
  the only count that separates the ranks. A socket closed between two reads drops out.
- host_ss(): every TCP connection of the network namespace (one per simulated host) as `ss -tin`
  prints them, bytes_sent and bytes_acked summed: the issue's per-host count.
- link(ifname): the interface's tx/rx bytes and packets from /proc/net/dev (what `ip -s link`
  shows): headers and ACKs included. On loopback all ranks share `lo`, so it counts them all.
"""
import os
import re
import socket
import struct
import subprocess

# struct tcp_info (include/uapi/linux/tcp.h): u64 tcpi_bytes_acked at 120, tcpi_bytes_received
# at 128, tcpi_bytes_sent at 200, tcpi_bytes_retrans at 208 (checked by tests/train/
# test_sockbytes.py on a socket pair).
_ACKED, _RECEIVED, _SENT, _RETRANS, _INFO_LEN = 120, 128, 200, 208, 232


def tcp_info_bytes(sock):
    """(bytes_sent, bytes_acked, bytes_received, bytes_retrans) of a connected TCP socket."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
    if len(info) < _RETRANS + 8:
        raise OSError("TCP_INFO without tcpi_bytes_sent (Linux < 4.19)")
    return tuple(struct.unpack_from("=Q", info, off)[0] for off in (_SENT, _ACKED, _RECEIVED, _RETRANS))


def process():
    """{bytes_sent, bytes_acked, bytes_received, bytes_retrans, sockets} summed over this
    process's TCP sockets."""
    out = dict(bytes_sent=0, bytes_acked=0, bytes_received=0, bytes_retrans=0, sockets=0)
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            fd = os.dup(int(name))
        except OSError:  # closed meanwhile
            continue
        s = socket.socket(fileno=fd)  # owns the duplicate only; closing it leaves the original
        try:
            if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                continue
            sent, acked, received, retrans = tcp_info_bytes(s)
        except OSError:
            continue
        finally:
            s.close()
        out["bytes_sent"] += sent
        out["bytes_acked"] += acked
        out["bytes_received"] += received
        out["bytes_retrans"] += retrans
        out["sockets"] += 1
    return out


def parse_ss(text):
    """{bytes_sent, bytes_acked, connections} summed over `ss -tin`'s output."""
    out = dict(bytes_sent=0, bytes_acked=0, connections=0)
    for key in ("bytes_sent", "bytes_acked"):
        out[key] = sum(int(v) for v in re.findall(rf"\b{key}:(\d+)", text))
    out["connections"] = len(re.findall(r"^ESTAB", text, re.M))
    return out


def host_ss():
    """parse_ss of this network namespace's `ss -tin`, or None where ss cannot run."""
    try:
        text = subprocess.run(["ss", "-tin"], capture_output=True, text=True, timeout=10,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ss(text)


def link(ifname):
    """{tx_bytes, tx_packets, rx_bytes, rx_packets} of `ifname` from /proc/net/dev, or None."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, sep, rest = line.partition(":")
            if sep and name.strip() == ifname:
                v = [int(x) for x in rest.split()]
                return dict(rx_bytes=v[0], rx_packets=v[1], tx_bytes=v[8], tx_packets=v[9])
    return None


def diff(before, after):
    """after - before, key by key (None if either is None)."""
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after}
