"""studies/lib/ports.py (free_master_port, for the tests' and the studies' local launches): a
MASTER_PORT pair outside the kernel's ephemeral range."""
import socket

import pytest

from studies.lib import ports as _ports


def _binds(port):
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))


@pytest.mark.parametrize("low,high,want", [
    (32768, 60999, (20000, 32767, True)),   # Linux's default: the room below
    (21000, 65535, (8999, 20999, True)),    # nothing above: below, 12000 ports
    (10000, 65535, (1024, 9999, True)),     # below, down to 1024
    (1024, 40000, (40001, 65535, True)),    # nothing below: above
    (1024, 65535, (1024, 65535, False)),    # no room outside: every unprivileged port
    (1200, 65400, (1024, 65535, False)),    # less than MIN_ROOM on either side
])
def test_candidates(low, high, want):
    lo, hi, outside = _ports.candidates(low, high)
    assert (lo, hi, outside) == want
    if outside:  # every P drawn (lo <= P < hi) has P and P + 1 outside [low, high]
        assert hi <= low - 1 or lo > high


def test_pair_binds_and_is_outside_the_ephemeral_range():
    low, high = _ports._local_port_range()
    lo, hi, outside = _ports.candidates(low, high)
    seen = set()
    for _ in range(50):
        p = _ports.free_master_port()
        assert lo <= p < hi
        if outside:
            assert not (low <= p <= high) and not (low <= p + 1 <= high), (p, low, high)
        _binds(p)
        _binds(p + 1)
        assert p not in seen and p + 1 not in seen and p - 1 not in seen  # never handed out twice
        seen.add(p)


def test_busy_port_is_never_returned(monkeypatch):
    # Three free pairs A, B, C; A + 1 and C are then bound here: drawn in the order A, C, B, the
    # helper must pass over A (its P + 1 is busy) and C (busy) and return B.
    a, b, c = (_ports.free_master_port() for _ in range(3))
    monkeypatch.setattr(_ports, "_given", _ports.collections.deque(maxlen=1024))
    draws = iter([a, c, b])

    class Draw:
        def randrange(self, lo, hi):
            return next(draws, None) or pytest.fail("drew past B: B or B + 1 was not free")
    monkeypatch.setattr(_ports, "_draw", Draw())
    with socket.socket() as s, socket.socket() as t:
        s.bind(("0.0.0.0", a + 1))
        t.bind(("0.0.0.0", c))
        assert _ports.free_master_port() == b


def test_a_port_handed_out_lately_is_not_drawn_again(monkeypatch):
    p = _ports.free_master_port()
    draws = iter([p, p - 1, p + 1, p + 5])  # p, p - 1 (its P + 1 is p) and p + 1 were given

    class Draw:
        def randrange(self, lo, hi):
            return next(draws)
    monkeypatch.setattr(_ports, "_draw", Draw())
    monkeypatch.setattr(_ports, "_free", lambda port: True)
    assert _ports.free_master_port() == p + 5


def test_a_small_room_does_not_fill_up_with_old_ports(monkeypatch):
    # 299 start ports (1024-1322): 300 calls must all succeed, every port free (mocked).
    monkeypatch.setattr(_ports, "_local_port_range", lambda: (1324, 65535))
    monkeypatch.setattr(_ports, "_free", lambda port: True)
    monkeypatch.setattr(_ports, "_given", _ports.collections.deque(maxlen=1024))
    assert _ports.candidates(1324, 65535) == (1024, 1323, True)
    got = [_ports.free_master_port() for _ in range(300)]
    assert all(1024 <= p < 1323 for p in got)


def test_nothing_free_raises(monkeypatch):
    monkeypatch.setattr(_ports, "_free", lambda port: False)
    with pytest.raises(RuntimeError, match="no free port pair"):
        _ports.free_master_port()
