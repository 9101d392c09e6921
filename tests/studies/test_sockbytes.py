"""studies/lib/sockbytes.py's counters against bytes this test sends itself over loopback, and its
parsers on text of the tools' formats; procstat.py's counters move the right way."""
import os
import socket
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from studies.lib import procstat, sockbytes


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    srv.close()
    return c, s


def _send(c, s, n):
    c.sendall(b"x" * n)
    got = 0
    while got < n:
        got += len(s.recv(65536))


def test_tcp_info_offsets():
    c, s = _pair()
    n = 100_003
    _send(c, s, n)
    sent, _, received, retrans = sockbytes.tcp_info_bytes(c)
    assert sent == n and received == 0 and retrans == 0
    assert sockbytes.tcp_info_bytes(s)[2] == n
    deadline = time.monotonic() + 5
    while sockbytes.tcp_info_bytes(c)[1] < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sockbytes.tcp_info_bytes(c)[1] >= n  # acked (+1 for the SYN on Linux)


def test_process_counts_only_what_this_process_sends():
    c, s = _pair()
    before = sockbytes.process()
    _send(c, s, 54_321)
    d = sockbytes.diff(before, sockbytes.process())
    assert d["bytes_sent"] == 54_321 and d["bytes_received"] == 54_321


def test_parse_ss():
    text = ("State Recv-Q Send-Q Local Address:Port Peer Address:Port\n"
            "ESTAB 0 0 10.77.0.1:4000 10.77.0.2:5000\n"
            "\t cubic rto:204 bytes_sent:1500 bytes_acked:1501 bytes_received:20 segs_out:3\n"
            "ESTAB 0 0 10.77.0.1:4001 10.77.0.3:5001\n"
            "\t cubic bytes_sent:25 bytes_retrans:5 bytes_acked:26 segs_out:1\n")
    assert sockbytes.parse_ss(text) == dict(bytes_sent=1525, bytes_acked=1527, connections=2)


def test_link_lo_moves():
    c, s = _pair()
    before = sockbytes.link("lo")
    _send(c, s, 200_000)
    d = sockbytes.diff(before, sockbytes.link("lo"))
    assert d["tx_bytes"] >= 200_000 and d["tx_packets"] > 0  # headers, ACKs and others' traffic too
    assert sockbytes.link("no-such-if0") is None


def test_procstat():
    a = procstat.snapshot()
    x = 0
    for i in range(300_000):
        x += i
    d = procstat.delta_ms(a, procstat.snapshot())
    assert d["cpu_ms"] > 0 and d["run_delay_ms"] >= 0
