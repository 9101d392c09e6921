"""examples/: started by hand without a launcher (no --spawn, no torchrun), each script exits
non-zero before torch.distributed's init, naming the variables missing and the ways to start it
(torch's own error would be a bare "environment variable RANK expected")."""
import os
import subprocess
import sys

import pytest

import lowrank

from conftest import ROOT
from test_fsdp import needs_fsdp2

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


SCRIPTS = ["ddp_cpu.py", pytest.param("fsdp_hsdp_cpu.py", marks=needs_fsdp2)]


def run_example(script, *args):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["MASTER_PORT"] = "29500"  # one set, three not: the message names those missing
    # the lowrank these tests import (in-tree: python/, which the tests put on sys.path themselves)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_launcher_says_how_to_start(script):
    r = run_example(script, "--epochs", "1")
    assert r.returncode != 0, r.stdout + r.stderr
    assert "RANK, WORLD_SIZE, MASTER_ADDR not set" in r.stderr, r.stderr
    assert "--spawn N" in r.stderr and "torchrun" in r.stderr, r.stderr
    assert "environment variable RANK expected" not in r.stderr, r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("n", ["0", "-1"])
def test_spawn_needs_at_least_one_process(script, n):
    r = run_example(script, "--spawn", n, "--epochs", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--spawn N: N >= 1, got {n}" in r.stderr, r.stderr
