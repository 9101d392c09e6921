"""A MASTER_PORT for a job whose processes are started on this host (tests, examples, perf)."""
import random
import socket

_draw = random.SystemRandom()
_given = set()  # ports this process has handed out: two jobs of one process never share one


def _local_port_range():
    """The kernel's ephemeral range (ports it gives to bind(0) and outgoing connections)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_master_port(host="0.0.0.0"):
    """A port P such that P and P + 1 bind on `host` now: torch's store listens on MASTER_PORT and
    lowrank's comm rank 0 on MASTER_PORT + 1 (include/lowrank/lowrank.h).

    P is drawn at random outside the kernel's ephemeral range. A port checked free is bound only
    later, by the rank that listens there; a port from the ephemeral range (bind to 0) can be taken
    meanwhile by any process's outgoing connection or port-0 listener, and the job fails with
    "address already in use" or meets a stranger. Drawing at random makes two jobs started at once
    unlikely to collide; a process never hands out a port twice. Returns an int; RuntimeError if
    200 draws find no free pair. Thread safety: not thread-safe."""
    low, high = _local_port_range()
    lo, hi = (20000, low - 2) if low >= 22000 else (high + 1, 65533)
    if hi <= lo:
        lo, hi = 1024, 65533  # no room outside it: any unprivileged port
    for _ in range(200):
        p = _draw.randrange(lo, hi)
        if p in _given or p + 1 in _given:
            continue
        try:
            for q in (p, p + 1):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, q))
        except OSError:
            continue
        _given.update((p, p + 1))
        return p
    raise RuntimeError(f"no free port pair found in {lo}-{hi}")
