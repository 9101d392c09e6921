"""Shared by the Python tests: the package in-tree, and ranks started as processes with
torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) under one deadline, forked
from a server that has imported torch (launch.py) or exec'd."""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

# Communicators choose their host algorithm from the given constants, never from links measured
# when they are made (issue 40): the comparisons bit for bit between communicators, here and in
# every process these tests start, must not depend on timing. As meson's default test setup does;
# this covers pytest run directly (the wheel stage). The probe's own tests turn it on.
os.environ.setdefault("LOWRANK_UCX_PROBE", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)

import launch  # noqa: E402  (tests/python, on the path just above)
from studies.lib.ports import free_master_port as free_port  # noqa: E402  (P and P + 1)


BIND_RACE = "address already in use"  # torch 1.13's "Address ...", 2.x's "... EADDRINUSE, message: address ..."


def run_ranks(world, *args, timeout=120, env=None, rank_env=None, worker="ddp_worker.py",
              launch="fork"):
    """Runs `worker` (a script of tests/python, ddp_worker.py unless told) ARGS as `world`
    processes; returns [(returncode, result dict or None, output, seconds)], returncode "HUNG"
    for a process killed at the deadline, -N for one killed by signal N. rank_env(r): more
    variables for rank r. launch: "fork" (from a server that has imported torch: launch.py) or
    "exec" (a new interpreter, as torchrun starts it). A free port can be taken by another
    program between free_port() and the workers' bind: a run whose failure says so runs once
    more on another port (the machine's race, not lowrank's)."""
    once = _run_forked if launch == "fork" else _run_execed
    out = once(world, args, timeout, env, rank_env, worker)
    if any(res is None and BIND_RACE in text.lower() for _, res, text, _ in out):
        out = once(world, args, timeout, env, rank_env, worker)
    return out


def _rank_envs(world, env, rank_env):
    port = free_port()
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        e.update(env or {})
        e.update(rank_env(r) if rank_env else {})
        yield e


def _result_of(text):
    res = None
    for line in text.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
    return res


def _run_execed(world, args, timeout, env, rank_env, worker):
    procs = [(time.monotonic(), subprocess.Popen(
        [sys.executable, os.path.join(HERE, worker)] + [str(a) for a in args],
        env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for e in _rank_envs(world, env, rank_env)]
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
        out.append((rc, _result_of(text), text, time.monotonic() - t0))
    return out


def _run_forked(world, args, timeout, env, rank_env, worker):
    ctx = launch.context()
    with tempfile.TemporaryDirectory(prefix="lowrank-ranks-") as tmp:
        procs = []
        for r, e in enumerate(_rank_envs(world, env, rank_env)):
            path = os.path.join(tmp, f"rank{r}.out")
            p = ctx.Process(target=launch.run_script,
                            args=(os.path.join(HERE, worker), [str(a) for a in args], e, path))
            p.start()
            procs.append((time.monotonic(), p, path))
        deadline = time.monotonic() + timeout
        out = []
        for t0, p, path in procs:
            p.join(max(0.1, deadline - time.monotonic()))
            rc = p.exitcode
            if rc is None:
                p.kill()
                p.join()
                rc = "HUNG"
            with open(path, errors="replace") as f:
                text = f.read()
            out.append((rc, _result_of(text), text, time.monotonic() - t0))
    return out


def results(runs):
    """The result dicts, failing the test with every rank's output tail if one is missing."""
    bad = [(i, rc, text) for i, (rc, res, text, _) in enumerate(runs) if rc != 0 or res is None]
    if bad:
        pytest.fail("\n".join(f"rank {i} rc={rc}:\n" + "\n".join(text.splitlines()[-15:])
                              for i, rc, text in bad))
    return [res for _, res, _, _ in runs]


@pytest.fixture
def world_of_one():
    """torch.distributed in this process, a world of 1 (gloo)."""
    import torch.distributed as dist
    for attempt in range(3):  # a free port can be taken by another program before the bind
        try:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                    world_size=1)
            break
        except RuntimeError as e:
            if "Address already in use" not in str(e) or attempt == 2:
                raise
    yield
    dist.destroy_process_group()


# Settings both hooks (DDP's lowrank.torch.hook, FSDP2's lowrank.torch.fsdp) refuse alike, with the
# error and a part of its message: one rule per setting, lowrank.torch.settings.
BAD_SETTINGS = [
    (dict(matrix_approximation_rank=-1), ValueError, "matrix_approximation_rank=-1 is out of range"),
    (dict(matrix_approximation_rank=70000), ValueError, "[0, 65536]"),
    (dict(matrix_approximation_rank=2.0), TypeError, "matrix_approximation_rank must be an int"),
    (dict(matrix_approximation_rank=True), TypeError, "matrix_approximation_rank must be an int"),
    (dict(start_powerSGD_iter=2.7), TypeError, "start_powerSGD_iter must be an int, not 2.7"),
    (dict(start_powerSGD_iter=-1), ValueError, "start_powerSGD_iter=-1 is out of range"),
    (dict(random_seed=-5), ValueError, "random_seed=-5"),
    (dict(min_compression_rate=0.5), ValueError, "min_compression_rate must be a finite number >= 1"),
    (dict(orthogonalization_epsilon=float("nan")), ValueError, "orthogonalization_epsilon"),
    (dict(timeout=0), ValueError, "timeout must be a finite number > 0"),
    (dict(timeout="30"), TypeError, "timeout must be a number"),
    (dict(min_compression_rate=None), TypeError, "min_compression_rate must be a number"),
    (dict(start_powerSGD_iter=(1 << 30) + 1), ValueError, "[0, 1073741824]"),
    (dict(pipeline="yes"), TypeError, "pipeline must be True or False or None"),
    (dict(use_error_feedback=2), TypeError, "use_error_feedback must be True or False"),
    (dict(alternate="yes"), TypeError, "alternate must be True or False, not 'yes'"),
    (dict(alternate=None), TypeError, "alternate must be True or False, not None"),
    (dict(alternate=True, warm_start=False), ValueError,
     "alternate=True needs warm_start=True"),
    (dict(factor_dtype="int8"), ValueError,
     "factor_dtype must be one of 'fp32', 'bf16', 'fp16' (or 'float32', 'bfloat16', 'float16', "
     "torch.float32, torch.bfloat16, torch.float16), not 'int8'"),
    (dict(factor_dtype="bf 16"), ValueError, "factor_dtype must be one of 'fp32', 'bf16'"),
    (dict(factor_dtype=16), TypeError, "factor_dtype must be one of 'fp32', 'bf16'"),
    (dict(factor_dtype=True), TypeError, "factor_dtype must be one of 'fp32', 'bf16'"),
]
