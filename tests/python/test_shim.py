"""With the NCCL shim preloaded, lowrank's own NCCL communicator (the hook's path for CUDA
buckets) is never seen by the shim: no buffer is compressed twice, and the hook wins. Over the
NCCL test double (host memory), so it runs without a GPU. The paths come from meson
(LOWRANK_TEST_SHIM, LOWRANK_TEST_NCCL_DOUBLE_DIR); without them the test skips."""
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DETECTION = 2  # the shim's calls of a recurring sequence that go to NCCL first
SHIM = os.environ.get("LOWRANK_TEST_SHIM", "")
DOUBLE = os.environ.get("LOWRANK_TEST_NCCL_DOUBLE_DIR", "")

pytestmark = pytest.mark.skipif(not (os.path.exists(SHIM) and os.path.isdir(DOUBLE)),
                                reason="the NCCL shim or the NCCL test double was not built "
                                       "(no nccl.h): run through meson test")


def run(preload):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOWRANK_") or k in ("LOWRANK_LIBRARY", "LOWRANK_TEST_INSTALLED")}
    env.update(LD_LIBRARY_PATH=DOUBLE, LOWRANK_DEBUG="INFO", LOWRANK_MIN_BYTES="65536",
               LOWRANK_APPROX_RANK="4", LOWRANK_TIMEOUT="30", LOWRANK_UCX_PROBE="0")
    if preload:
        env["LD_PRELOAD"] = SHIM
    p = subprocess.run([sys.executable, os.path.join(HERE, "shim_worker.py")], env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads([l for l in p.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    reports = re.findall(r"NCCL shim: comm \S+ \(comm rank (\d+) of \d+, device -?\d+\) destroyed: "
                         r"(\d+) calls compressed", p.stdout + p.stderr)
    return res, reports


def test_shim_never_sees_lowranks_own_nccl_comm():
    plain, plain_reports = run(preload=False)
    shim, shim_reports = run(preload=True)
    for r in range(2):
        # the hook's path: the same bits with and without the shim, and compressed once, by lowrank
        assert shim[r]["hook"] == plain[r]["hook"]
        assert shim[r]["hook_stats"]["compressedCalls"] == 3
        assert shim[r]["hook_stats"]["compressedCalls"] == plain[r]["hook_stats"]["compressedCalls"]
        # the application's ncclAllReduce: the shim passes the first two calls to NCCL (it sees
        # the call recur twice, docs/nccl_shim.md) and compresses the others
        app, ref = shim[r]["app"], plain[r]["app"]
        assert len(app) == len(ref) > DETECTION
        assert app[:DETECTION] == ref[:DETECTION]
        assert all(a != b for a, b in zip(app[DETECTION:], ref[DETECTION:]))
    assert plain_reports == []
    # one report per comm rank, for the application's comm only, with its later calls compressed:
    # lowrank's own NCCL comms never reached the shim
    n = str(len(shim[0]["app"]) - DETECTION)
    assert sorted(shim_reports) == [("0", n), ("1", n)]
    assert shim[0]["hook"] == shim[1]["hook"]
