"""Calibration of the hosts' links (studies/lib/netns_hosts.sh): does each link delay and pace like
a wire at the rate and delay it is set to? Every benchmark and study over the hosts runs it first
and records its result; a run whose calibration fails is refused (issue 40).

The checks (rate in bit/s, delay one way; wire bytes: every Ethernet frame whole, its 14-byte
header, IP and TCP headers included, as studies/lib/wire/wire.cc counts them):
  ping_pong  the median of >= 50 round trips of a 64-byte ICMP echo (as ping's; host 0 to host 1,
             after 5 untimed ones; host 1's kernel answers, so no program's wake-up is counted
             there) within 5% + 0.1 ms of 2 x delay;
  message    a 252 KB TCP message (host 0 to 1, on a connection warmed by 2 messages, each measured
             one after 40 ms idle; the median of 3), from the sender's first byte to the receiver's
             last, within 5% of wire bytes / rate + delay;
  (both stamped by the kernel, as ping(8) stamps a reply: the first byte when its segment reaches
  the sending host's device, SO_TIMESTAMPING, the last when the receiving host's stack takes it
  in, SO_TIMESTAMPNS; the programs' own wake-ups, 20-60 us each on these VMs, and the sender's
  copying of the message are the hosts', not the link's. Program times where a kernel gives none.)
  fan_out    host 0 sending 252 KB to each of hosts 1-3 at once after 40 ms idle: the last byte no
             earlier than 3 x wire bytes / rate + delay in each of 3 rounds (a sender that bursts
             would beat it; needs 4 hosts);
  bulk       one TCP stream for 1.5 s (the first 0.3 s not counted): goodput within 3% of
             rate x MSS / (MSS + headers) = rate x 1448/1514 at MTU 1500.
Without a rate only ping_pong runs (the others would have nothing to compare with); fan_out is
skipped with fewer than 4 hosts. Skipped checks are recorded as skipped, never as passed.
The programs inside the hosts are studies/lib/calib_peer.py, run at real-time priority (chrt -f 1)
where allowed, so that the machine's other work delays them less (recorded: helpers_rt; the bulk
stream excepted: CPU-bound, it would meet the kernel's RT throttling); the wire's thread runs above
them.

Use:  cal = calibrate.checked(hosts)   # hosts: studies.lib.hosts.Hosts, made and shaped
      result["calibration"] = cal      # a dict for the run's JSON; checked() raised if it failed
CLI (for the shell drivers): python3 -m studies.lib.calibrate --tag TAG --hosts N [--out FILE]
      prints one line per check; exit status 1 if one failed (FILE is written either way);
      attach() then adds the files to the driver's result JSON.
Runs in about 2 s + 1.5 s of bulk at 100 Mbit/s, not thread-safe (fixed ports on the hosts)."""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calib_peer.py")
PY = "/usr/bin/python3"
PORT = 17300
MESSAGE_BYTES = 252_000
IDLE_S = 0.04
PINGS = 60
ATTEMPTS = 3    # a failed calibration is measured again, up to this many times in all,
PAUSE_S = 5.0   # this far apart; every attempt is recorded (with_retries)


class CalibrationError(RuntimeError):
    """A link failed its calibration; the message names each failed check with its numbers."""


def addr(i):
    """Host i's address (netns_hosts.sh's address plan)."""
    return f"10.77.0.{i + 1}"


def _rt_prefix():
    ok = shutil.which("chrt") and subprocess.run(["chrt", "-f", "1", "true"],
                                                 capture_output=True).returncode == 0
    return ["chrt", "-f", "1"] if ok else []


class _Peers:
    """The calib_peer.py processes of one calibration; close() ends the servers."""

    def __init__(self, hosts, rt):
        self.hosts, self.rt, self.servers = hosts, rt, []

    def _cmd(self, i, *args):
        # not the bulk stream: a CPU-bound real-time process would meet the RT throttling
        rt = [] if args[0].startswith("tcp-bulk") else self.rt
        return self.hosts.prefix(i) + rt + [PY, PEER, *map(str, args)]

    def server(self, i, *args):
        p = subprocess.Popen(self._cmd(i, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.servers.append(p)
        if p.stdout.readline().strip() != "ready":
            raise CalibrationError(f"calib_peer {args[0]} on host {i} did not start: "
                                   f"{p.stderr.read() if p.poll() is not None else '(still running)'}")
        return p

    def client(self, i, *args, timeout=60):
        r = subprocess.run(self._cmd(i, *args), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise CalibrationError(f"calib_peer {args[0]} on host {i} failed: {r.stderr.strip()}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def close(self):
        for p in self.servers:
            p.kill()
            p.wait()


def wire_bytes(payload, mss, mtu=1500):
    """Bytes on the wire of a TCP payload sent in full segments: each segment carries mss bytes
    and (mtu + 14) - mss bytes of Ethernet, IP and TCP headers (66 at MTU 1500 with timestamps)."""
    return payload + math.ceil(payload / mss) * (mtu + 14 - mss)


def _check(passed, **numbers):
    return dict(passed=bool(passed), **numbers)


def ping_pong(peers, delay_s, pings=PINGS):
    rtt = peers.client(0, "icmp-ping", addr(1), pings, 5, 0.002)["rtt_s"]
    med, want = statistics.median(rtt), 2 * delay_s
    tol = 0.05 * want + 1e-4
    q = statistics.quantiles(rtt, n=10)
    return _check(abs(med - want) <= tol, median_s=med, want_s=want, tolerance_s=tol,
                  p10_s=q[0], p90_s=q[-1], min_s=min(rtt), max_s=max(rtt), n=len(rtt))


def _send_rounds(peers, to, nbytes, rounds):
    port = PORT + 1 + len(peers.servers)
    for i in to:
        peers.server(i, "tcp-sink", port)
    r = peers.client(0, "tcp-send", port, nbytes, 2, rounds, IDLE_S, *map(addr, to))
    # from the sender's first byte: the first of its threads to start sending
    return r["mss"], [max(x["t_last"]) - min(x["t_start"]) for x in r["rounds"]]


def message(peers, rate, delay_s, nbytes=MESSAGE_BYTES, rounds=3):
    mss, times = _send_rounds(peers, [1], nbytes, rounds)
    wb = wire_bytes(nbytes, mss) + wire_bytes(8, mss)  # + the 8-byte length, its own segment
    want = wb * 8 / rate + delay_s
    med = statistics.median(times)
    return _check(abs(med - want) <= 0.05 * want, median_s=med, want_s=want, tolerance_s=0.05 * want,
                  wire_bytes=wb, times_s=times, idle_s=IDLE_S)


def fan_out(peers, rate, delay_s, nbytes=MESSAGE_BYTES, rounds=3):
    mss, times = _send_rounds(peers, [1, 2, 3], nbytes, rounds)
    wb = wire_bytes(nbytes, mss) + wire_bytes(8, mss)  # + the 8-byte length, its own segment
    bound = 3 * wb * 8 / rate + delay_s
    return _check(min(times) >= bound, min_s=min(times), at_least_s=bound,
                  ratio=min(times) / bound, times_s=times, wire_bytes_each=wb, idle_s=IDLE_S)


def bulk(peers, rate, seconds=1.5, skip=0.3, mtu=1500):
    port = PORT + 10
    sink = peers.server(1, "tcp-bulk-sink", port, skip)
    mss = peers.client(0, "tcp-bulk", addr(1), port, seconds)["mss"]
    out, _ = sink.communicate(timeout=60)
    r = json.loads(out.strip().splitlines()[-1])
    goodput = r["bytes"] * 8 / (r["t_last"] - r["t_from"])
    want = rate * mss / (mtu + 14)
    return _check(abs(goodput / want - 1) <= 0.03, goodput_bps=goodput, want_bps=want,
                  ratio=goodput / want, mss=mss, seconds=seconds, skipped_s=skip)


def rt_runtime_us():
    """kernel.sched_rt_runtime_us, or None where it cannot be read. At the default (950000) the
    kernel stops every real-time thread (the wire's, the NAPI threads, the helpers) for the rest of
    a second once they used 0.95 s of it, which 1 Gbit/s can reach (docs/benchmarks.md, "Links")."""
    try:
        with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def calibrate(hosts, *, pings=PINGS, message_bytes=MESSAGE_BYTES, bulk_s=1.5):
    """Runs the checks on `hosts` (a made studies.lib.hosts.Hosts, or anything with n, prefix(i),
    settings() -> (kind, rate bit/s, delay s) and link_stats() -> str) at the rate and delay they
    are set to. Returns a dict for a run's JSON: link, rate_bps, delay_s, hosts, when, loadavg,
    helpers_rt, rt_runtime_us (the kernel's real-time throttling; -1: off), checks {name: {passed,
    measured numbers (seconds, bit/s), the target}}, skipped {name: why}, failed [names], passed
    (bool), wire (the wire's release lateness over the checks, its status line; "" for netem).
    rt_runtime_us is None where /proc cannot be read. Raises CalibrationError if a helper cannot
    run; a failed check is only recorded (see checked())."""
    kind, rate, delay_s = hosts.settings()
    if hosts.n < 2:
        raise CalibrationError("calibration needs at least 2 hosts")
    rt = _rt_prefix()
    out = dict(link=kind, rate_bps=rate, delay_s=delay_s, hosts=hosts.n,
               when=time.strftime("%Y-%m-%dT%H:%M:%S%z"), loadavg=os.getloadavg(),
               helpers_rt=bool(rt), rt_runtime_us=rt_runtime_us(), checks={}, skipped={})
    hosts.link_stats()  # counters from here on
    runs = [("ping_pong", lambda p: ping_pong(p, delay_s, pings))]
    if rate:
        runs += [("message", lambda p: message(p, rate, delay_s, message_bytes))]
        if hosts.n >= 4:
            runs += [("fan_out", lambda p: fan_out(p, rate, delay_s, message_bytes))]
        else:
            out["skipped"]["fan_out"] = "needs 4 hosts"
        runs += [("bulk", lambda p: bulk(p, rate, bulk_s))]
    else:
        for name in ("message", "fan_out", "bulk"):
            out["skipped"][name] = "no rate set"
    for name, run in runs:
        peers = _Peers(hosts, rt)
        try:
            out["checks"][name] = run(peers)
        finally:
            peers.close()
    out["wire"] = hosts.link_stats()
    out["failed"] = [k for k, v in out["checks"].items() if not v["passed"]]
    out["passed"] = not out["failed"]
    return out


def describe(cal):
    """One line per check: name, pass/FAIL, measured against target."""
    lines = [f"link {cal['link']}, {cal['rate_bps'] / 1e6:g} Mbit/s, delay {cal['delay_s'] * 1e3:g} ms, "
             f"{cal['hosts']} hosts, load {cal['loadavg'][0]:.1f}, "
             f"sched_rt_runtime_us {cal.get('rt_runtime_us')}"]
    for name, c in cal["checks"].items():
        word = "pass" if c["passed"] else "FAIL"
        if "median_s" in c:
            what = f"median {c['median_s'] * 1e3:.3f} ms, want {c['want_s'] * 1e3:.3f} +- {c['tolerance_s'] * 1e3:.3f} ms"
        elif "at_least_s" in c:
            what = f"last byte after {c['min_s'] * 1e3:.3f} ms, want >= {c['at_least_s'] * 1e3:.3f} ms"
        else:
            what = f"goodput {c['goodput_bps'] / 1e6:.2f} Mbit/s, want {c['want_bps'] / 1e6:.2f} +- 3%"
        lines.append(f"  {name}: {word}: {what}")
    lines += [f"  {k}: skipped ({v})" for k, v in cal["skipped"].items()]
    if cal.get("wire"):
        lines.append(f"  wire: {cal['wire']}")
    return "\n".join(lines)


def require(cal):
    """Raises CalibrationError naming every failed check of `cal` (calibrate()'s dict)."""
    if not cal["passed"]:
        raise CalibrationError("the links failed their calibration; the run is refused:\n" + describe(cal))
    return cal


def with_retries(hosts, attempts=ATTEMPTS, pause_s=PAUSE_S, **kw):
    """calibrate() up to `attempts` times, `pause_s` apart, until one passes: a check disturbed by
    the machine (the previous run's processes still exiting, another program's burst) is measured
    again, never excused. Returns the last attempt's dict, with "earlier_attempts": the failed
    ones before it (each whole), so a run records every attempt."""
    earlier, n = [], max(1, attempts)
    for i in range(n):
        if i:
            time.sleep(pause_s)
        cal = calibrate(hosts, **kw)
        if cal["passed"] or i == n - 1:
            cal["earlier_attempts"] = earlier
            return cal
        earlier.append(cal)
    raise AssertionError("unreachable")


def checked(hosts, **kw):
    """with_retries() then require(): the calibration dict of links that passed, else raises."""
    return require(with_retries(hosts, **kw))


def attach(json_path, cal_paths, key="calibration"):
    """Adds the calibrations in the files `cal_paths` (--out of the CLI) to the run's JSON object in
    `json_path` under `key`, as a list in the order given (the shell drivers' way to record them)."""
    with open(json_path) as f:
        d = json.load(f)
    d[key] = []
    for p in cal_paths:
        with open(p) as f:
            d[key].append(json.load(f))
    with open(json_path, "w") as f:
        json.dump(d, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Calibrate the links of hosts made by netns_hosts.sh "
                                 "(HOSTS_TAG, HOSTS_N); exit 1 if a check fails")
    ap.add_argument("--tag", required=True, help="their HOSTS_TAG")
    ap.add_argument("--hosts", type=int, required=True, help="their HOSTS_N")
    ap.add_argument("--out", help="write the calibration's JSON here")
    ap.add_argument("--bulk-s", type=float, default=1.5)
    ap.add_argument("--attempts", type=int, default=ATTEMPTS,
                    help=f"calibrations until one passes, {PAUSE_S:g} s apart (default {ATTEMPTS})")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from studies.lib.hosts import Hosts
    cal = with_retries(Hosts(a.hosts, tag=a.tag), attempts=a.attempts, bulk_s=a.bulk_s)
    for e in cal["earlier_attempts"]:
        print("earlier attempt, failed:\n" + describe(e))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(cal, f, indent=1)
    print(describe(cal))
    return 0 if cal["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
