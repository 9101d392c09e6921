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
                                              each; the 8-byte length in a segment of its own),
                                              WARMUP rounds, then ROUNDS after IDLE_S idle:
                                              {"mss", "rounds": [{"t_start": [per ADDR],
                                              "t_last": [per ADDR]}]}: when each length's
                                              segment reached the device, the sink's last byte
Times are kernel stamps where the kernel gives them (SO_TIMESTAMPING on sending, SO_TIMESTAMPNS on
receiving), else the program's own: the link's times, not the programs' wake-ups.
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
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's values where Python lacks them
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# a software stamp when a send's last byte is handed to the device, read from the error queue
TX_STAMP_FLAGS = (1 << 1) | (1 << 4) | (1 << 11)  # TX_SOFTWARE | SOFTWARE | OPT_TSONLY


def _tx_stamps(c):
    """The software stamps (SO_TIMESTAMPING) of the sends on c handed to its device so far, as
    time.monotonic(), in order; drains c's error queue."""
    out, timeout = [], c.gettimeout()
    c.setblocking(False)  # a socket with a timeout would wait for the queue to become readable
    while True:
        try:
            _, anc, _, _ = c.recvmsg(64, 512, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            c.settimeout(timeout)
            return out
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                sec, nsec = struct.unpack("qq", data[:16])  # [0]: the software stamp
                out.append(sec + nsec * 1e-9 - (time.time() - time.monotonic()))


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


def _rx_stamp(anc):
    """The SO_TIMESTAMPNS stamp in a recvmsg's ancillary data, as time.monotonic(); else None."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec * 1e-9 - (time.time() - time.monotonic())
    return None


def icmp_ping(addr, count, warmup, gap):
    # stamped by the kernel where it allows, as ping(8) does on receipt: the echo left this host's
    # device (SO_TIMESTAMPING) and its reply came in (SO_TIMESTAMPNS), not when this program ran
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.connect((addr, 0))
    s.settimeout(5)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
    ident, rtts, stamped = os.getpid() & 0xFFFF, [], 0
    for seq in range(int(warmup) + int(count)):
        body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"x" * 56  # 64 bytes, as ping's
        body = body[:2] + struct.pack("!H", _icmp_checksum(body)) + body[4:]
        _tx_stamps(s)
        t = time.monotonic()
        s.send(body)
        while True:
            r, anc, _, _ = s.recvmsg(2048, 512)
            t_back = time.monotonic()
            ihl = (r[0] & 0xF) * 4
            typ, _, _, rid, rseq = struct.unpack("!BBHHH", r[ihl:ihl + 8])
            if typ == 0 and rid == ident and rseq == seq:
                break
        tx, rx = _tx_stamps(s), _rx_stamp(anc)
        if tx and rx is not None:
            t, t_back, stamped = tx[0], rx, stamped + (seq >= int(warmup))
        if seq >= int(warmup):
            rtts.append(t_back - t)
        time.sleep(float(gap))
    print(json.dumps({"rtt_s": rtts, "kernel_stamped": stamped}))


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


def _recv_exact_stamped(c, n, buf):
    """_recv_exact that also returns when the kernel took in the last byte's segment
    (SO_TIMESTAMPNS, as time.monotonic()): the link's arrival, not this program's wake-up."""
    view, got, stamp = memoryview(buf), 0, None
    while got < n:
        k, anc, _, _ = c.recvmsg_into([view[: min(len(buf), n - got)]], 64)
        if k == 0:
            raise EOFError
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", data[:16])
                stamp = sec + nsec * 1e-9
        got += k
    # CLOCK_REALTIME to time.monotonic(): the offset now (the two clocks move together)
    return None if stamp is None else stamp - (time.time() - time.monotonic())


def _sink_conn(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    buf = bytearray(CHUNK)
    try:
        while True:
            _recv_exact(c, 8, buf)
            n = struct.unpack("!Q", buf[:8])[0]
            stamp = _recv_exact_stamped(c, n, buf)
            c.sendall(struct.pack("!d", time.monotonic() if stamp is None else stamp))
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
        c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
    head, body = struct.pack("!Q", nbytes), b"\0" * nbytes
    out = []
    for r in range(int(warmup) + int(rounds)):
        time.sleep(float(idle))
        go, t_last, t_start = threading.Event(), [None] * len(conns), [None] * len(conns)
        for c in conns:
            _tx_stamps(c)  # the previous round's

        def one(i):
            go.wait()
            t_start[i] = time.monotonic()  # this thread's own start, not go.set()'s: no wake-up
            # the length alone first (TCP_NODELAY: its own segment), stamped when it reaches the
            # device: the message's first byte on the link, not this host's copying of the rest
            conns[i].sendall(head)
            conns[i].sendall(body)
            buf = bytearray(8)
            _recv_exact(conns[i], 8, buf)
            t_last[i] = struct.unpack("!d", buf)[0]
            stamps = _tx_stamps(conns[i])  # the first: the length's segment, every byte's before
            t_start[i] = stamps[0] if stamps else t_start[i]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        time.sleep(0.002)  # every thread waiting on `go`
        go.set()
        for t in threads:
            t.join()
        if r >= int(warmup):
            out.append({"t_start": t_start, "t_last": t_last})
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
