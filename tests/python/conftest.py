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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, *args, timeout=120, env=None, rank_env=None):
    """Runs ddp_worker.py ARGS as `world` processes; returns [(returncode, result dict or None,
    output, seconds)], returncode "HUNG" for a process killed at the deadline. rank_env(r): more
    variables for rank r."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        e.update(env or {})
        e.update(rank_env(r) if rank_env else {})
        procs.append((time.monotonic(), subprocess.Popen(
            [sys.executable, os.path.join(HERE, "ddp_worker.py")] + [str(a) for a in args],
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
