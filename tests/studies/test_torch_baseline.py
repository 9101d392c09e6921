"""The fair PyTorch baseline (studies/train/torch_baseline.py, issue 27 item 1): PyTorch's
powerSGD_hook chained bucket after bucket keeps the replicas identical over gloo with several
buckets (the digits CNN with bucket_cap_mb 0.25: four buckets), and computes what the waited
hook computes. Two processes each (tests/studies/baseline_worker.py), under the Python running
pytest (meson runs it under both torches).
"""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
from studies.lib import launch
from studies.lib.ports import free_master_port
from studies.train import digits, train

STEPS, START_ITER, WORLD = 8, 2, 2


def run_ranks(kind, out):
    os.makedirs(out)
    port = str(free_master_port())
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "baseline_worker.py"),
                               "--kind", kind, "--steps", str(STEPS), "--start-iter",
                               str(START_ITER), "--out", out],
                              env=launch.env(**train._worker_env(r, WORLD, port)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    texts = []
    for p in procs:
        try:
            texts.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{kind}: a rank hung")
    for p, text in zip(procs, texts):
        assert p.returncode == 0, f"{kind}: exit {p.returncode}:\n{text[-3000:]}"
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    return {kind: run_ranks(kind, str(tmp / kind)) for kind in ("chained", "waited")}


def test_several_buckets_and_compression(results):
    for kind, ranks in results.items():
        for r in ranks:
            assert r["buckets"] >= 3, (kind, r["buckets"])
            assert r["iters"] == STEPS
            assert r["compressed"] > 10, (kind, r["compressed"])  # PowerSGD ran after warm-up


def test_trained(results):
    torch.manual_seed(0)  # the worker's initial weights
    init = list(digits.DigitsCNN().parameters())
    moved = [not torch.equal(a, b) for a, b in zip(results["chained"][0]["params"], init)]
    assert all(moved), moved


def test_identical_across_ranks(results):
    for kind, ranks in results.items():
        for p0, p1 in zip(ranks[0]["params"], ranks[1]["params"]):
            assert torch.equal(p0, p1), kind


def test_chained_equals_waited(results):
    for pc, pw in zip(results["chained"][0]["params"], results["waited"][0]["params"]):
        torch.testing.assert_close(pc, pw, rtol=1e-5, atol=1e-6)


def test_same_issue_order_on_every_rank(results):
    """The chained hook's point: both ranks issue the hook's allreduces in one order: the warm-up's
    one per bucket, then per compressed step U, P, Q of each bucket in bucket order, the same
    sequence every step."""
    for kind, ranks in results.items():
        seqs = [r["issued"] for r in ranks]
        assert seqs[0] == seqs[1], kind
        per_step, compressed = 3 * ranks[0]["buckets"], STEPS - START_ITER
        warm = len(seqs[0]) - per_step * compressed
        assert START_ITER <= warm <= START_ITER * ranks[0]["buckets"], (kind, warm)
        tail = seqs[0][warm:]
        assert tail == tail[:per_step] * compressed, kind
