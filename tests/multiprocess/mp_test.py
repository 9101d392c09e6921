#!/usr/bin/env python3
"""Multi-process tests of lowrank: real processes started as launchers start them.

    mp_test.py CASE --worker PATH [--keep]

CASE:
  env        2, 3 and 4 processes from plain launcher variables (torchrun's, LOWRANK_*, Open MPI's,
             PMI's, Slurm's), with and without UCX_TLS=tcp,self, the root started last; every
             process's outputs equal those of comm ranks as threads of one process, bit for bit
  envparse   malformed / missing launcher variables, a root port in use, a wrong secret: the
             documented errors; strays (garbage, wrong secret) at the root port are refused while
             the communicator still forms
  failure    SIGKILL and SIGSTOP of one process mid-run with LOWRANK_TIMEOUT=3: every survivor
             returns lowrankRemoteError or lowrankTimeout and exits within 3 s + a margin
  mismatch   mismatched counts -> lowrankInvalidUsage on every process; a comm rank that calls
             fewer times -> the others time out with an error
  netns      two "hosts": two network namespaces joined by a veth pair (root only; skipped else)
  mpirun     under Open MPI's mpirun (skipped when Debian's openmpi-bin is not installed)
  checkpoint lowrankBufferSaveState / RestoreState across process lifetimes (issue 16): 3 processes
             make 20 calls of a per-tensor and a batched buffer, save and exit; 3 new processes
             (and, once, 3 threads of one process) restore and make 20 more, bit-identical to an
             uninterrupted run of 40 on every rank, with and without LOWRANK_WARM_START, and across
             the end of a warm-up (LOWRANK_START_ITER); then the
             refusals: another comm size, comm rank or k (lowrankInvalidUsage naming it), and a
             restore on comm rank 0 only (its first call fails on every rank, no hang; a
             lowrankBufferReset on rank 0 brings the buffers back)

Exit status: 0 pass, 1 fail, 77 skipped (meson's convention).
"""
import argparse
import os
import random
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import testlib  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the root
from studies.lib.ports import free_master_port as free_port_pair  # noqa: E402  (P and P + 1)
from testlib import SKIP, check, finish, log, start  # noqa: E402

RESULT_NAMES = {0: "lowrankSuccess", 2: "lowrankSystemError", 5: "lowrankInvalidUsage",
                6: "lowrankRemoteError", 8: "lowrankTimeout"}
# Variables of launchers and of lowrank that must not leak in from the environment of the test.
LAUNCHER_VARS = ["LOWRANK_RANK", "LOWRANK_WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT",
                 "LOWRANK_ROOT_ADDR", "LOWRANK_SECRET", "LOWRANK_SOCKET_IFNAME", "UCX_TLS",
                 "UCX_NET_DEVICES", "LOWRANK_TIMEOUT"]


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["LOWRANK_TIMEOUT"] = "20"
    env.update({k: str(v) for k, v in extra.items()})
    return env


_rng = random.SystemRandom()


def show(res, label):
    for r, (rc, out, err) in enumerate(res):
        testlib.show(f"{label} {r}", rc, out, err, lines=8)


def reference(worker, n, tmp):
    prefix = os.path.join(tmp, f"threads{n}")
    if not os.path.exists(f"{prefix}.0"):
        res = finish([start([worker, "threads", str(n), prefix], base_env())], 120)
        if res[0][0] != 0:
            show(res, "threads")
            raise RuntimeError(f"threads reference with {n} comm ranks failed")
    return [open(f"{prefix}.{r}", "rb").read() for r in range(n)]


def compare(worker, n, prefix, tmp, label):
    ref = reference(worker, n, tmp)
    ok = True
    for r in range(n):
        path = f"{prefix}.{r}"
        got = open(path, "rb").read() if os.path.exists(path) else None
        ok &= check(got is not None and got == ref[r],
                    f"{label}: process comm rank {r} == threads comm rank {r} bit for bit"
                    + ("" if got is not None else " (no output file)"))
        ok &= check(ref[r] == ref[0], f"{label}: comm rank {r} == comm rank 0 (identical on every rank)")
    return ok


# ---- env -----------------------------------------------------------------------------------------

def rank_env(style, r, n, port, secret):
    if style == "torchrun":
        return dict(RANK=r, WORLD_SIZE=n, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    if style == "lowrank":
        return dict(LOWRANK_RANK=r, LOWRANK_WORLD_SIZE=n, LOWRANK_ROOT_ADDR=f"localhost:{port + 1}",
                    LOWRANK_SECRET=secret)
    if style == "ompi":
        return dict(OMPI_COMM_WORLD_RANK=r, OMPI_COMM_WORLD_SIZE=n,
                    LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}")
    if style == "pmi":
        return dict(PMI_RANK=r, PMI_SIZE=n, MASTER_ADDR="localhost", MASTER_PORT=port)
    if style == "slurm":
        return dict(SLURM_PROCID=r, SLURM_NTASKS=n, LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}",
                    LOWRANK_SECRET=secret)
    raise ValueError(style)


def run_processes(worker, n, style, tmp, ucx_tls=None, root_last=False, label=""):
    port = free_port_pair()
    secret = secrets.token_hex(16)
    prefix = os.path.join(tmp, f"out_{style}_{n}_{port}")
    procs = [None] * n
    order = list(range(1, n)) + [0] if root_last else list(range(n))
    t0 = time.monotonic()
    for r in order:
        extra = rank_env(style, r, n, port, secret)
        if ucx_tls:
            extra["UCX_TLS"] = ucx_tls
        procs[r] = start([worker, "run", prefix], base_env(**extra))
        if root_last and r == order[-2]:
            time.sleep(0.5)  # the root comes late: the others retry their connection
    res = finish(procs, 60)
    dt = time.monotonic() - t0
    ok = check(all(rc == 0 for rc, _, _ in res), f"{label}: {n} processes exit 0 ({dt:.1f} s)")
    if not ok:
        show(res, "proc")
        return False
    return compare(worker, n, prefix, tmp, label)


def case_env(args, tmp):
    w = args.worker
    for n in (2, 3, 4):
        run_processes(w, n, "torchrun", tmp, label=f"n={n} RANK/WORLD_SIZE/MASTER_*")
        run_processes(w, n, "torchrun", tmp, ucx_tls="tcp,self",
                      label=f"n={n} RANK/WORLD_SIZE/MASTER_*, UCX_TLS=tcp,self")
        run_processes(w, n, "lowrank", tmp, ucx_tls="tcp,self", root_last=True,
                      label=f"n={n} LOWRANK_* + LOWRANK_SECRET, UCX_TLS=tcp,self, root last")
    run_processes(w, 2, "ompi", tmp, ucx_tls="tcp,self", label="n=2 OMPI_COMM_WORLD_*")
    run_processes(w, 3, "pmi", tmp, label="n=3 PMI_* + MASTER_ADDR=localhost")
    run_processes(w, 2, "slurm", tmp, ucx_tls="tcp,self", label="n=2 SLURM_PROCID/SLURM_NTASKS")


# ---- envparse ------------------------------------------------------------------------------------

def init_result(worker, extra, timeout=30):
    rc, out, err = finish([start([worker, "init"], base_env(**extra))], timeout)[0]
    for line in out.splitlines():
        if line.startswith("RESULT "):
            code, _, msg = line[len("RESULT "):].partition(": ")
            return int(code), msg
    return None, f"rc={rc} out={out!r} err={err[-400:]!r}"


def expect_init(worker, extra, code, needles, label):
    got, msg = init_result(worker, extra)
    ok = check(got == code and all(s in msg for s in needles),
               f"{label}: {RESULT_NAMES.get(code, code)} naming {needles}")
    if not ok:
        log(f"    got {got}: {msg}")


def case_envparse(args, tmp):
    w = args.worker
    port = free_port_pair()
    root = dict(LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}")
    expect_init(w, {}, 5, ["LOWRANK_RANK/LOWRANK_WORLD_SIZE", "RANK/WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"], "no variables")
    expect_init(w, dict(RANK=2, WORLD_SIZE=2, **root), 5, ["RANK=2", "WORLD_SIZE=2"], "rank >= size")
    expect_init(w, dict(RANK="x1", WORLD_SIZE=2, **root), 5, ["RANK=\"x1\""], "non-integer rank")
    expect_init(w, dict(RANK=0, WORLD_SIZE="2.5", **root), 5, ["WORLD_SIZE=\"2.5\""],
                "non-integer size")
    expect_init(w, dict(LOWRANK_RANK=0, **root), 5, ["LOWRANK_WORLD_SIZE"], "half a LOWRANK_ pair")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1), 5, ["LOWRANK_ROOT_ADDR", "MASTER_ADDR"],
                "no root address")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1"), 5, ["MASTER_PORT"],
                "MASTER_ADDR without MASTER_PORT")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT="65535"), 5,
                ["MASTER_PORT"], "MASTER_PORT + 1 out of range")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, LOWRANK_ROOT_ADDR="127.0.0.1"), 5,
                ["LOWRANK_ROOT_ADDR"], "LOWRANK_ROOT_ADDR without a port")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, LOWRANK_ROOT_ADDR="no-such-host.invalid:1234"), 5,
                ["LOWRANK_ROOT_ADDR", "no-such-host.invalid"], "unresolvable host")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, LOWRANK_SECRET="abc", **root), 5, ["LOWRANK_SECRET"],
                "malformed LOWRANK_SECRET")
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, LOWRANK_TIMEOUT="soon", **root), 5,
                ["LOWRANK_TIMEOUT"], "malformed LOWRANK_TIMEOUT")
    # A one-process communicator forms (the root is also its only client).
    expect_init(w, dict(RANK=0, WORLD_SIZE=1, **root), 0, ["comm rank 0 of 1"], "world of one")
    # The root's port is taken: lowrankSystemError with the address.
    port = free_port_pair()
    root = dict(LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}")
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("127.0.0.1", port + 1))
    busy.listen(1)
    try:
        expect_init(w, dict(RANK=0, WORLD_SIZE=2, **root), 2, [f"127.0.0.1:{port + 1}", "in use"],
                    "root port in use")
    finally:
        busy.close()
    # A comm rank whose secret differs from the root's is refused: it fails, the others time out.
    port = free_port_pair()
    procs = []
    for r in range(2):
        extra = dict(LOWRANK_RANK=r, LOWRANK_WORLD_SIZE=2, LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}",
                     LOWRANK_SECRET=secrets.token_hex(16), LOWRANK_TIMEOUT=2)
        procs.append(start([w, "init"], base_env(**extra)))
    res = finish(procs, 20)
    codes = [next((int(l.split()[1].rstrip(":")) for l in out.splitlines() if l.startswith("RESULT")),
                  None) for _, out, _ in res]
    if not check(codes[1] in (6, 8) and codes[0] in (6, 8),
                 f"different LOWRANK_SECRET: refused (comm rank 1 got {codes[1]}), root times out "
                 f"({codes[0]})"):
        show(res, "proc")


    # Strays at the root's port while the communicator forms: garbage, and a hello with a wrong
    # secret, are closed; the communicator still forms.
    port = free_port_pair()
    extra = dict(LOWRANK_WORLD_SIZE=2, LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}",
                 LOWRANK_SECRET=secrets.token_hex(16), LOWRANK_TIMEOUT=10)
    root = start([w, "init"], base_env(LOWRANK_RANK=0, **extra))
    closed = []
    for payload in (b"GET / HTTP/1.0\r\n\r\n" + bytes(64), b"LRHELLO1" + secrets.token_bytes(16)):
        deadline = time.monotonic() + 5
        while True:
            try:
                c = socket.create_connection(("127.0.0.1", port + 1), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        with c:
            c.sendall(payload)
            try:
                closed.append(c.recv(1) == b"")
            except ConnectionResetError:
                closed.append(True)
            except socket.timeout:
                closed.append(False)
    other = start([w, "init"], base_env(LOWRANK_RANK=1, **extra))
    res = finish([root, other], 20)
    check(closed == [True, True], f"strays at the root port closed (garbage, wrong secret): {closed}")
    if not check(all("RESULT 0:" in out for _, out, _ in res),
                 "the communicator forms despite the strays"):
        show(res, "proc")


# ---- failure -------------------------------------------------------------------------------------

TIMEOUT = 3.0
MARGIN_ERROR = 2.0  # error returned within TIMEOUT + this after the kill
MARGIN_EXIT = 3.0   # process gone within TIMEOUT + this after the kill


def failure_run(worker, n, victim, sig, tmp, ucx_tls=None):
    label = (f"n={n}, {signal.Signals(sig).name} comm rank {victim}"
             + (f", UCX_TLS={ucx_tls}" if ucx_tls else ""))
    log(f"-- {label}")
    port = free_port_pair()
    procs = []
    for r in range(n):
        extra = dict(RANK=r, WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                     LOWRANK_TIMEOUT=TIMEOUT)
        if ucx_tls:
            extra["UCX_TLS"] = ucx_tls
        procs.append(start([worker, "loop", "100000000"], base_env(**extra)))
    # Wait until every process has made its first call.
    deadline = time.monotonic() + 30
    ready = [False] * n
    early = None
    while not all(ready) and early is None and time.monotonic() < deadline:
        waiting = {procs[r].stdout.fileno(): r for r in range(n) if not ready[r]}
        readable, _, _ = select.select(list(waiting), [], [], 0.5)
        for fd in readable:
            r = waiting[fd]
            line = procs[r].stdout.readline()  # the worker writes whole lines
            if line.startswith("READY"):
                ready[r] = True
            elif line == "":
                early = r
    if not check(all(ready), f"{label}: all {n} processes running"):
        for p in procs:
            p.kill()
        show(finish(procs, 10), "proc")
        return
    time.sleep(0.3)  # mid-run
    t_kill = time.monotonic()
    os.kill(procs[victim].pid, sig)
    survivors = [r for r in range(n) if r != victim]
    results = {}
    try:
        for r in survivors:
            p = procs[r]
            try:
                out, err = p.communicate(timeout=max(0.1, t_kill + TIMEOUT + 15 - time.monotonic()))
                results[r] = (p.returncode, out, err, time.monotonic() - t_kill)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                results[r] = ("HUNG", out, err, None)
    finally:
        procs[victim].kill()
        procs[victim].communicate()
    for r in survivors:
        rc, out, err, t_exit = results[r]
        err_line = next((l for l in out.splitlines() if l.startswith("ERROR ")), None)
        code, t_err = None, None
        if err_line:
            code = int(err_line.split()[1])
            t_err = float(err_line.split()[2][2:]) - t_kill
        ok = check(rc == 3 and code in (6, 8),
                   f"{label}: comm rank {r} returned {RESULT_NAMES.get(code, code)}, exit {rc}")
        if ok:
            ok = check(t_err <= TIMEOUT + MARGIN_ERROR,
                       f"{label}: comm rank {r} error {t_err:.2f} s after the signal "
                       f"(<= {TIMEOUT + MARGIN_ERROR:g})")
            ok &= check(t_exit <= TIMEOUT + MARGIN_EXIT,
                        f"{label}: comm rank {r} exited {t_exit:.2f} s after the signal "
                        f"(<= {TIMEOUT + MARGIN_EXIT:g})")
        if ok and code == 6:  # a peer gone: said in the user's words, UCX's in parentheses
            ok = check(re.search(r"comm rank \d+ disconnected .*\(its process died .*; UCX: [^)]+\)",
                                 err_line) is not None,
                       f"{label}: comm rank {r}'s error names the comm rank that disconnected")
        if err_line:
            log(f"    comm rank {r}: {err_line[:300]}")
        if not ok:
            show([(rc, out, err)], f"survivor {r}")


def case_failure(args, tmp):
    w = args.worker
    failure_run(w, 3, 1, signal.SIGKILL, tmp, ucx_tls="tcp,self")
    failure_run(w, 2, 0, signal.SIGKILL, tmp)
    failure_run(w, 3, 2, signal.SIGSTOP, tmp, ucx_tls="tcp,self")
    failure_run(w, 4, 0, signal.SIGSTOP, tmp)


# ---- mismatch ------------------------------------------------------------------------------------

def case_mismatch(args, tmp):
    w = args.worker
    n = 3
    port = free_port_pair()
    procs = [start([w, "mismatch"], base_env(RANK=r, WORLD_SIZE=n, MASTER_ADDR="127.0.0.1",
                                              MASTER_PORT=port, LOWRANK_TIMEOUT=10))
             for r in range(n)]
    t0 = time.monotonic()
    res = finish(procs, 30)
    dt = time.monotonic() - t0
    for r, (rc, out, err) in enumerate(res):
        line = next((l for l in out.splitlines() if l.startswith("RESULT")), "")
        check(rc == 0, f"mismatched counts: comm rank {r}: lowrankInvalidUsage ({line[:200]})")
    check(dt < 8, f"mismatched counts: every process done in {dt:.1f} s, no timeout")

    port = free_port_pair()
    procs = [start([w, "fewer", "4"], base_env(RANK=r, WORLD_SIZE=n, MASTER_ADDR="127.0.0.1",
                                                MASTER_PORT=port, LOWRANK_TIMEOUT=2))
             for r in range(n)]
    res = finish(procs, 30)
    for r, (rc, out, err) in enumerate(res):
        line = next((l for l in out.splitlines() if l.startswith(("RESULT", "SHORT"))), "")
        what = "the short comm rank idles" if r == n - 1 else "error on the unmatched call"
        if not check(rc == 0, f"fewer calls: comm rank {r}: {what} ({line[:240]})"):
            show([(rc, out, err)], "proc")


# ---- netns ---------------------------------------------------------------------------------------

def sh(*cmd, check_rc=True):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stdout.strip()}")
    return r


def case_netns(args, tmp):
    if os.geteuid() != 0:
        log("SKIP: creating network namespaces needs root")
        return SKIP
    if not shutil.which("ip"):
        log("SKIP: the `ip` command (iproute2) is not installed")
        return SKIP
    tag = f"{os.getpid() % 100000}"
    ns = [f"lrA{tag}", f"lrB{tag}"]
    dev = [f"lrvA{tag}", f"lrvB{tag}"]
    net = _rng.randrange(1, 250)
    ip = [f"10.77.{net}.1", f"10.77.{net}.2"]
    try:
        r = sh("ip", "netns", "add", ns[0], check_rc=False)
        if r.returncode != 0:
            log(f"SKIP: `ip netns add` is not available here: {r.stdout.strip()}")
            return SKIP
        sh("ip", "netns", "add", ns[1])
        sh("ip", "link", "add", dev[0], "type", "veth", "peer", "name", dev[1])
        for i in range(2):
            sh("ip", "link", "set", dev[i], "netns", ns[i])
            sh("ip", "-n", ns[i], "addr", "add", f"{ip[i]}/24", "dev", dev[i])
            sh("ip", "-n", ns[i], "link", "set", dev[i], "up")
            sh("ip", "-n", ns[i], "link", "set", "lo", "up")
        ping = sh("ip", "netns", "exec", ns[1], "ping", "-c", "1", "-W", "2", ip[0], check_rc=False) \
            if shutil.which("ping") else None
        if ping is not None:
            log(f"  ping {ip[0]} from {ns[1]}: rc={ping.returncode}")
        for style in ("torchrun", "lowrank"):
            port = free_port_pair()
            prefix = os.path.join(tmp, f"out_netns_{style}_{port}")
            procs = []
            secret = secrets.token_hex(16)
            for r in range(2):
                if style == "torchrun":
                    extra = dict(RANK=r, WORLD_SIZE=2, MASTER_ADDR=ip[0], MASTER_PORT=port)
                else:
                    extra = dict(LOWRANK_RANK=r, LOWRANK_WORLD_SIZE=2,
                                 LOWRANK_ROOT_ADDR=f"{ip[0]}:{port + 1}",
                                 LOWRANK_SECRET=secret)
                extra.update(UCX_TLS="tcp,self", UCX_NET_DEVICES=dev[r],
                             LOWRANK_SOCKET_IFNAME=dev[r])
                procs.append(start([args.worker, "run", prefix], base_env(**extra),
                                   prefix_cmd=("ip", "netns", "exec", ns[r])))
            t0 = time.monotonic()
            res = finish(procs, 60)
            label = f"two namespaces over veth, {style} variables"
            if check(all(rc == 0 for rc, _, _ in res),
                     f"{label}: both exit 0 ({time.monotonic() - t0:.1f} s)"):
                compare(args.worker, 2, prefix, tmp, label)
            else:
                show(res, "proc")
    finally:
        for n in ns:
            sh("ip", "netns", "del", n, check_rc=False)
        left = sh("ip", "netns", "list", check_rc=False).stdout
        check(not any(n in left for n in ns), "namespaces removed")
    return 0


# ---- mpirun --------------------------------------------------------------------------------------

def case_mpirun(args, tmp):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        log("SKIP: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        return SKIP
    ver = sh(mpirun, "--version", check_rc=False).stdout
    if "Open MPI" not in ver and "OpenRTE" not in ver:
        log(f"SKIP: mpirun is not Open MPI's ({ver.strip().splitlines()[:1]})")
        return SKIP
    for n in (2, 3):
        port = free_port_pair()
        prefix = os.path.join(tmp, f"out_mpirun_{n}_{port}")
        cmd = [mpirun, "--oversubscribe", "-np", str(n)]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        env = base_env(LOWRANK_ROOT_ADDR=f"127.0.0.1:{port + 1}", UCX_TLS="tcp,self",
                       OMPI_MCA_btl="self,tcp", OMPI_MCA_pml="ob1")
        for v in ("LOWRANK_ROOT_ADDR", "UCX_TLS", "LOWRANK_TIMEOUT"):
            cmd += ["-x", v]
        t0 = time.monotonic()
        res = finish([start(cmd + [args.worker, "run", prefix], env)], 90)
        label = f"mpirun -np {n}"
        if check(res[0][0] == 0, f"{label}: exit 0 ({time.monotonic() - t0:.1f} s)"):
            compare(args.worker, n, prefix, tmp, label)
        else:
            show(res, "mpirun")
    return 0


# ---- checkpoint ----------------------------------------------------------------------------------

CKPT_CALLS = 20
# Bytes of one call's outputs in `mp_worker ckpt`: a float32 per-tensor buffer (48x40, 40, 32x24)
# and a bfloat16 batched one of 3000.
CKPT_CALL_BYTES = 4 * (48 * 40 + 40 + 32 * 24) + 2 * 3000


def ckpt_run(worker, n, args, label, timeout=60, **env):
    """`mp_worker ckpt ARGS` as n processes (torchrun variables); returns [(rc, out, err)], or
    None after a failed check when some process did not exit 0."""
    port = free_port_pair()
    t0 = time.monotonic()
    env = dict(dict(LOWRANK_TIMEOUT=10), **env)
    procs = [start([worker, "ckpt"] + [str(a) for a in args],
                   base_env(RANK=r, WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env))
             for r in range(n)]
    res = finish(procs, timeout)
    ok = check(all(rc == 0 for rc, _, _ in res),
               f"{label}: {n} processes exit 0 ({time.monotonic() - t0:.1f} s)")
    if not ok:
        show(res, "proc")
        return None
    return res


def ckpt_threads(worker, n, args, label, timeout=60, **env):
    t0 = time.monotonic()
    env = dict(dict(LOWRANK_TIMEOUT=10), **env)
    res = finish([start([worker, "ckpt"] + [str(a) for a in args] + [f"threads={n}"],
                        base_env(**env))], timeout)
    if not check(res[0][0] == 0, f"{label}: {n} threads exit 0 ({time.monotonic() - t0:.1f} s)"):
        show(res, "threads")
        return None
    return res


def read_outputs(prefix, n):
    return [open(f"{prefix}.{r}", "rb").read() if os.path.exists(f"{prefix}.{r}") else None
            for r in range(n)]


def tagged(out, tag):
    """The lines '[rank] TAG ...' of a worker's stdout: {rank: [rest of line]}."""
    got = {}
    for line in out.splitlines():
        if line.startswith("[") and "] " in line:
            r, _, rest = line[1:].partition("] ")
            if rest.startswith(tag + " "):
                got.setdefault(int(r), []).append(rest[len(tag) + 1:])
    return got


def case_checkpoint(args, tmp):
    w = args.worker
    n = 3
    c = CKPT_CALLS
    d = os.path.join(tmp, "ckpt")
    os.makedirs(d)

    # -- resume: bit-identical to the uninterrupted run. Warm start on; off (each call's fresh Q is
    # drawn from the call count, restored); and a warm-up (LOWRANK_START_ITER=25) that the restore
    # falls in (the saving run made exact calls only; compression starts at call 26 in both runs).
    configs = [("ws1", "warm start", dict(LOWRANK_WARM_START=1)),
               ("ws0", "LOWRANK_WARM_START=0", dict(LOWRANK_WARM_START=0)),
               ("warmup", "LOWRANK_START_ITER=25", dict(LOWRANK_START_ITER=25))]
    for tag, name, env in configs:
        full = os.path.join(d, f"full_{tag}")
        state = os.path.join(d, f"state_{tag}" + ".{r}.{b}")
        if not ckpt_run(w, n, [0, 2 * c, f"out={full}"], f"{name}: {2 * c} calls uninterrupted",
                        **env):
            continue
        save = [0, c, f"out={os.path.join(d, 'first_' + tag)}", f"save={state}"]
        if not ckpt_run(w, n, save + (["exact-only"] if tag == "warmup" else []),
                        f"{name}: {c} calls, save, exit", **env):
            continue
        ref = read_outputs(full, n)
        first = read_outputs(os.path.join(d, f"first_{tag}"), n)
        for r in range(n):
            check(first[r] == ref[r][:c * CKPT_CALL_BYTES],
                  f"{name}: comm rank {r}: the saving run's {c} calls == the first {c} of the "
                  "uninterrupted run")
        variants = [("processes, restore after the layout", ckpt_run, [])]
        if tag == "ws1":
            variants += [("processes, restore before the layout", ckpt_run, ["before-layout"]),
                         ("threads of one process, restore into buffers planned by 3 other calls",
                          ckpt_threads, ["pre=3"])]
        for i, (what, runner, extra) in enumerate(variants):
            resumed = os.path.join(d, f"resumed_{tag}_{i}")
            label = f"{name}, new {what}"
            res = runner(w, n, [c, c, f"out={resumed}", f"restore={state}"] + extra, label, **env)
            if not res:
                continue
            got = read_outputs(resumed, n)
            for r in range(n):
                want = ref[r][c * CKPT_CALL_BYTES:]
                check(got[r] is not None and len(want) == c * CKPT_CALL_BYTES and got[r] == want,
                      f"{label}: comm rank {r}: calls {c + 1}..{2 * c} bit-identical to the "
                      "uninterrupted run")
            # Without the restore the calls differ: the comparison above can tell them apart.
            if i == 0:
                fresh = os.path.join(d, f"fresh_{tag}")
                # (in the warm-up run: exact calls only, where the resumed run compresses from 26)
                ctl = [c, c, f"out={fresh}"] + (["exact-only"] if tag == "warmup" else [])
                if ckpt_run(w, n, ctl, f"{name}, control: the same calls, no restore", **env):
                    check(read_outputs(fresh, n)[0] != ref[0][c * CKPT_CALL_BYTES:],
                          f"{name}, control: without the restore the outputs differ from the "
                          "resumed run's")

    # -- refusals: another comm size or comm rank; each refused restore changes nothing.
    state = os.path.join(d, "state_ws1.{r}.{b}")
    w2 = os.path.join(d, "w2_state.{r}.{b}")
    if ckpt_run(w, 2, [0, 2, f"save={w2}"], "world 2: 2 calls, save"):
        w2_any = os.path.join(d, "w2_state.0.{b}")  # comm rank 2 of 3 has no world-2 file
        after = os.path.join(d, "after_refusals")
        res = ckpt_run(w, n, [0, 2, f"out={after}", f"try={w2_any}", f"try={w2}".replace("{r}", "1"),
                              f"try={state}".replace("{r}", "{r1}")],
                       "world 3, restores of world-2 bytes and of the next comm rank's bytes")
        if res:
            for r, (_, out, _) in enumerate(res):
                tries = tagged(out, "TRY").get(r, [])
                want = [("comm size", "saved with comm size 2, this buffer has 3")] * 4 + \
                       [("comm rank", f"saved with comm rank {(r + 1) % n}, this buffer has {r}")] * 2
                ok = len(tries) == len(want)
                for i, (t, (name, needle)) in enumerate(zip(tries, want)):
                    ok &= t.startswith(f"b{i % 2} 5: ") and needle in t
                if not check(ok, f"comm rank {r}: world-2 bytes refused naming the comm size, "
                                 "another comm rank's bytes naming the comm rank "
                                 "(lowrankInvalidUsage, each buffer)"):
                    log(f"    {tries}")
            got = read_outputs(after, n)
            ref = read_outputs(os.path.join(d, "full_ws1"), n)
            for r in range(n):
                check(got[r] is not None and ref[r] is not None and
                      got[r] == ref[r][:2 * CKPT_CALL_BYTES],
                      f"comm rank {r}: after the refused restores, the buffers are fresh (outputs == "
                      "the uninterrupted run's first calls)")
    # Another k: accepted. The bytes (format 2) carry each tensor's k, and a tensor restored at
    # another k goes on as after a change of k (docs/checkpoint.md); the calls after it succeed.
    res = ckpt_run(w, n, [0, 2, f"try={state}"], "LOWRANK_APPROX_RANK=2, restore of bytes saved at k 4",
                   LOWRANK_APPROX_RANK=2)
    if res:
        for r, (_, out, _) in enumerate(res):
            tries = tagged(out, "TRY").get(r, [])
            ok = len(tries) == 2 and all(t.startswith(f"b{b} 0: ") for b, t in enumerate(tries))
            if not check(ok, f"comm rank {r}: k differs: the restore is taken (each tensor's k is "
                             "in the bytes) and the calls after it succeed"):
                log(f"    {tries}")

    # -- a restore on comm rank 0 only: the next call of each buffer fails on every comm rank
    # (lowrankInvalidUsage naming the restored state), found by the plan check, not by a timeout
    # (LOWRANK_TIMEOUT=30: a wait for a peer would show); after lowrankBufferReset on comm rank 0
    # the calls succeed, as a fresh run's.
    only0 = os.path.join(d, "only0")
    t0 = time.monotonic()
    res = ckpt_run(w, n, [0, 3, f"out={only0}", f"restore={state}", "ranks=0", "retry"],
                   "restore on comm rank 0 only", timeout=60, LOWRANK_TIMEOUT=30)
    dt = time.monotonic() - t0
    if res:
        check(dt < 15, f"restore on comm rank 0 only: done in {dt:.1f} s (no timeout, no hang)")
        for r, (_, out, _) in enumerate(res):
            errs = tagged(out, "CALLERR").get(r, [])
            ok = len(errs) == 2 and all(e.startswith(f"c0 b{b} 5: ") and "restored state" in e
                                        for b, e in enumerate(errs))
            ok &= (r == 0) == bool(tagged(out, "RESTORED").get(r))
            if not check(ok, f"comm rank {r}: the first call of each buffer failed with "
                             "lowrankInvalidUsage naming the restored state"):
                log(f"    {errs}")
            if errs:
                log(f"    comm rank {r}: {errs[0][:260]}")
        got = read_outputs(only0, n)
        ref = read_outputs(os.path.join(d, "full_ws1"), n)
        for r in range(n):
            check(got[r] is not None and ref[r] is not None and got[r] == ref[r][:3 * CKPT_CALL_BYTES],
                  f"comm rank {r}: after lowrankBufferReset on comm rank 0, the calls succeed as "
                  "a fresh run's")
    return 0


CASES = dict(env=case_env, envparse=case_envparse, failure=case_failure, mismatch=case_mismatch,
             netns=case_netns, mpirun=case_mpirun, checkpoint=case_checkpoint)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--worker", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the output files")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=f"lowrank_mp_{args.case}_")
    t0 = time.monotonic()
    try:
        rc = CASES[args.case](args, tmp)
    except Exception as e:  # a setup failure is a test failure, with its message
        log(f"FAIL: {type(e).__name__}: {e}")
        testlib.failures.append(str(e))
        rc = 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"{args.case}: {time.monotonic() - t0:.1f} s")
    if rc == SKIP:
        return SKIP
    return testlib.verdict()


if __name__ == "__main__":
    sys.exit(main())
