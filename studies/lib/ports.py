"""A MASTER_PORT for a job whose processes are started on this host: the studies' and the tests'
launches (not part of the lowrank package: tests/python/pkgpath.py puts the checkout's root on the
tests' path for it)."""
import collections
import random
import socket

_draw = random.SystemRandom()
_given = collections.deque(maxlen=1024)  # ports this process handed out lately (512 calls)
MIN_ROOM = 256  # fewer free start ports than this outside the ephemeral range: use any port


def _local_port_range():
    """The kernel's ephemeral range (ports it gives to bind(0) and outgoing connections)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def candidates(low, high):
    """(first, last + 1, outside) of the start ports P to draw from, P + 1 included: the larger
    of the room below the ephemeral range [low, high] (from 20000 down to 1024 as it allows) and
    the room above it; outside=False when neither has MIN_ROOM ports (e.g. a range of 1024-65535)
    and every unprivileged port is drawn from."""
    below = (max(1024, min(20000, low - 1 - 12000)), low - 1)  # P + 1 <= low - 1
    above = (high + 1, 65535)                                   # P + 1 <= 65535
    lo, hi = max(below, above, key=lambda r: r[1] - r[0])
    if hi - lo < MIN_ROOM:
        return 1024, 65535, False
    return lo, hi, True


def _free(port):
    """Whether `port` binds now on every IPv4 address and, where the host has IPv6, every IPv6
    one (torch 2.x's store listens on [::])."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, host in families:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 in this kernel or namespace
            continue
        with s:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_master_port():
    """A port P such that P and P + 1 bind now on every address: torch's store listens on
    MASTER_PORT and lowrank's comm rank 0 on MASTER_PORT + 1 (include/lowrank/lowrank.h).

    P is drawn at random outside the kernel's ephemeral range (/proc/sys/net/ipv4/
    ip_local_port_range) where it leaves room (candidates()): a port checked free is bound only
    later, by the rank that listens there, and a port of the ephemeral range can be taken
    meanwhile by any process's outgoing connection or port-0 listener (the job then fails with
    "address already in use" or meets a stranger). Drawing at random makes two jobs started at
    once unlikely to collide; a process does not hand out a port again within its last 512 calls
    (fewer where the room is small).
    Returns an int; RuntimeError if 200 draws find no free pair. Not thread-safe."""
    lo, hi, _ = candidates(*_local_port_range())
    # Remember no more than a quarter of the room (each pair blocks 3 start ports): a small room
    # must not fill up with ports handed out long ago.
    keep = min(len(_given), (hi - lo) // 4)
    recent = set(list(_given)[len(_given) - keep:]) if keep else set()
    for _ in range(200):
        p = _draw.randrange(lo, hi)
        if p in recent or p + 1 in recent:
            continue
        if _free(p) and _free(p + 1):
            _given.extend((p, p + 1))
            return p
    raise RuntimeError(f"no free port pair found in {lo}-{hi}")
