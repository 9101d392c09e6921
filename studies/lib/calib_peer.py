"""The programs studies/lib/calibrate.py runs inside the hosts (standard library only; one mode per
call, started by `ip netns exec NS python3 calib_peer.py MODE ...`). Times are time.monotonic()
seconds, one clock for every namespace of the machine, so a sender's start and a receiver's last
byte can be subtracted. Servers print "ready" once listening; clients print one JSON line.

  icmp-ping ADDR COUNT WARMUP GAP_S           COUNT timed ICMP echoes of 64 bytes (ping's default
                                              size; the peer's kernel answers) after WARMUP
                                              untimed ones (ARP, caches): {"rtt_s": [...]}
  udp-echo PORT                               echo every datagram until killed
  udp-ping ADDR PORT COUNT SIZE WARMUP GAP_S  COUNT timed round trips of SIZE bytes after WARMUP
                                              untimed ones (ARP, caches): {"rtt_s": [...]}
  tcp-sink PORT                               per connection, per message: an 8-byte length L, L
                                              bytes, then the time the last byte came back (8 bytes)
  tcp-send PORT BYTES WARMUP ROUNDS IDLE_S ADDR...  BYTES to every ADDR at once (one connection
                                              each), WARMUP rounds, then ROUNDS after IDLE_S idle:
                                              {"mss", "rounds": [{"t0", "t_last": [per ADDR]}]}
  tcp-bulk-sink PORT SKIP_S                   one connection read to its end: {"bytes", "t_from",
                                              "t_last"}: bytes after SKIP_S from the first byte
  tcp-bulk ADDR PORT SECONDS                  sends for SECONDS, then closes: {"mss"}
"""
import json
import os
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20


def _listen(port, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    if kind == socket.SOCK_STREAM:
        s.listen(16)
    print("ready", flush=True)
    return s


def _recv_exact(c, n, buf):
    view = memoryview(buf)
    got = 0
    while got < n:
        k = c.recv_into(view[: min(len(buf), n - got)])
        if k == 0:
            raise EOFError
        got += k


def _icmp_checksum(b):
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF


def icmp_ping(addr, count, warmup, gap):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.connect((addr, 0))
    s.settimeout(5)
    ident, rtts = os.getpid() & 0xFFFF, []
    for seq in range(int(warmup) + int(count)):
        body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"x" * 56  # 64 bytes, as ping's
        body = body[:2] + struct.pack("!H", _icmp_checksum(body)) + body[4:]
        t = time.monotonic()
        s.send(body)
        while True:
            r = s.recv(2048)
            ihl = (r[0] & 0xF) * 4
            typ, _, _, rid, rseq = struct.unpack("!BBHHH", r[ihl:ihl + 8])
            if typ == 0 and rid == ident and rseq == seq:
                break
        if seq >= int(warmup):
            rtts.append(time.monotonic() - t)
        time.sleep(float(gap))
    print(json.dumps({"rtt_s": rtts}))


def udp_echo(port):
    s = _listen(int(port), socket.SOCK_DGRAM)
    while True:
        d, a = s.recvfrom(65536)
        s.sendto(d, a)


def udp_ping(addr, port, count, size, warmup, gap):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((addr, int(port)))
    s.settimeout(5)
    msg, rtts = b"x" * int(size), []
    for i in range(int(warmup) + int(count)):
        t = time.monotonic()
        s.send(msg)
        s.recv(65536)
        if i >= int(warmup):
            rtts.append(time.monotonic() - t)
        time.sleep(float(gap))
    print(json.dumps({"rtt_s": rtts}))


def _sink_conn(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(CHUNK)
    try:
        while True:
            _recv_exact(c, 8, buf)
            n = struct.unpack("!Q", buf[:8])[0]
            _recv_exact(c, n, buf)
            c.sendall(struct.pack("!d", time.monotonic()))
    except (EOFError, ConnectionError):
        c.close()


def tcp_sink(port):
    s = _listen(int(port))
    while True:
        c, _ = s.accept()
        threading.Thread(target=_sink_conn, args=(c,), daemon=True).start()


def tcp_send(port, nbytes, warmup, rounds, idle, *addrs):
    nbytes = int(nbytes)
    conns = [socket.create_connection((a, int(port))) for a in addrs]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = struct.pack("!Q", nbytes) + b"\0" * nbytes
    out = []
    for r in range(int(warmup) + int(rounds)):
        time.sleep(float(idle))
        go, t_last = threading.Event(), [None] * len(conns)

        def one(i):
            go.wait()
            conns[i].sendall(msg)
            buf = bytearray(8)
            _recv_exact(conns[i], 8, buf)
            t_last[i] = struct.unpack("!d", buf)[0]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        time.sleep(0.002)  # every thread waiting on `go`
        t0 = time.monotonic()
        go.set()
        for t in threads:
            t.join()
        if r >= int(warmup):
            out.append({"t0": t0, "t_last": t_last})
    mss = conns[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    print(json.dumps({"mss": mss, "rounds": out}))


def tcp_bulk_sink(port, skip):
    s = _listen(int(port))
    c, _ = s.accept()
    buf = bytearray(CHUNK)
    n, t_first, t_from, t_last, counted = 0, None, None, None, 0
    while True:
        k = c.recv_into(buf)
        t = time.monotonic()
        if k == 0:
            break
        if t_first is None:
            t_first = t
        if t_from is None and t - t_first >= float(skip):
            t_from = t  # bytes from here on are counted (those of this read arrived before t)
        elif t_from is not None:
            counted += k
        n += k
        t_last = t
    c.close()
    print(json.dumps({"bytes": counted, "t_from": t_from, "t_last": t_last, "total": n}))


def tcp_bulk(addr, port, seconds):
    c = socket.create_connection((addr, int(port)))
    data, end = b"\0" * CHUNK, time.monotonic() + float(seconds)
    while time.monotonic() < end:
        c.sendall(data)
    mss = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # the receiver's close: every byte is in
    print(json.dumps({"mss": mss}))


MODES = {"icmp-ping": icmp_ping, "udp-echo": udp_echo, "udp-ping": udp_ping, "tcp-sink": tcp_sink, "tcp-send": tcp_send,
         "tcp-bulk-sink": tcp_bulk_sink, "tcp-bulk": tcp_bulk}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit(f"calib_peer.py: want one of {', '.join(MODES)} (see the docstring)")
    MODES[sys.argv[1]](*sys.argv[2:])
