"""Shared by the Python tests: the package in-tree, and ranks started as processes with
torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) under one deadline."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)


def free_port():
    """A port P free now with P + 1 free too (torch's store binds P, lowrank's root P + 1)."""
    while True:
        with socket.socket() as s, socket.socket() as t:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            try:
                t.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


BIND_RACE = "Address already in use"


def run_ranks(world, *args, timeout=120, env=None, rank_env=None, worker="ddp_worker.py"):
    """Runs `worker` (a script of tests/python, ddp_worker.py unless told) ARGS as `world`
    processes; returns [(returncode, result dict or None, output, seconds)], returncode "HUNG"
    for a process killed at the deadline. rank_env(r): more variables for rank r. A free port
    can be taken by another program between free_port() and the workers' bind: a run whose
    failure says so runs once more on another port (the machine's race, not lowrank's)."""
    out = _run_ranks_once(world, args, timeout, env, rank_env, worker)
    if any(res is None and BIND_RACE in text for _, res, text, _ in out):
        out = _run_ranks_once(world, args, timeout, env, rank_env, worker)
    return out


def _run_ranks_once(world, args, timeout, env, rank_env, worker):
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        e.update(env or {})
        e.update(rank_env(r) if rank_env else {})
        procs.append((time.monotonic(), subprocess.Popen(
            [sys.executable, os.path.join(HERE, worker)] + [str(a) for a in args],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    deadline = time.monotonic() + timeout
    out = []
    for t0, p in procs:
        try:
            text, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            rc = "HUNG"
        res = None
        for line in text.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
        out.append((rc, res, text, time.monotonic() - t0))
    return out


def results(runs):
    """The result dicts, failing the test with every rank's output tail if one is missing."""
    bad = [(i, rc, text) for i, (rc, res, text, _) in enumerate(runs) if rc != 0 or res is None]
    if bad:
        pytest.fail("\n".join(f"rank {i} rc={rc}:\n" + "\n".join(text.splitlines()[-15:])
                              for i, rc, text in bad))
    return [res for _, res, _, _ in runs]
