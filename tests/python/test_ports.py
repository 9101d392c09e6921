"""lowrank.free_master_port: a MASTER_PORT pair outside the kernel's ephemeral range."""
import socket

import pytest

import lowrank
from lowrank import _ports


def _binds(port):
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))


def test_pair_binds_and_is_outside_the_ephemeral_range():
    low, high = _ports._local_port_range()
    seen = set()
    for _ in range(50):
        p = lowrank.free_master_port()
        assert not (low <= p <= high) and not (low <= p + 1 <= high), (p, low, high)
        _binds(p)
        _binds(p + 1)
        assert p not in seen and p + 1 not in seen and p - 1 not in seen  # never handed out twice
        seen.add(p)


def test_busy_port_is_never_returned(monkeypatch):
    # Three free pairs A, B, C; A + 1 and C are then bound here: drawn in the order A, C, B, the
    # helper must pass over A (its P + 1 is busy) and C (busy) and return B.
    a, b, c = (lowrank.free_master_port() for _ in range(3))
    monkeypatch.setattr(_ports, "_given", set())
    draws = iter([a, c, b])
    monkeypatch.setattr(_ports, "_draw", type("Draw", (), {"randrange": lambda self, lo, hi: next(draws)})())
    with socket.socket() as s, socket.socket() as t:
        s.bind(("0.0.0.0", a + 1))
        t.bind(("0.0.0.0", c))
        assert _ports.free_master_port() == b


def test_no_room_outside_the_range_falls_back_to_unprivileged_ports(monkeypatch):
    monkeypatch.setattr(_ports, "_local_port_range", lambda: (1024, 65535))
    p = _ports.free_master_port()
    assert 1024 <= p < 65534


def test_nothing_free_raises(monkeypatch):
    monkeypatch.setattr(_ports, "_given", set(range(0, 65536)))
    with pytest.raises(RuntimeError, match="no free port pair"):
        _ports.free_master_port()
