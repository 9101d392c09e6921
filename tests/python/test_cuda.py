"""lowrank.torch on CUDA tensors: DDP over NCCL, lowrank over its own NCCL communicator. Skipped
where no device is present; tests/gpu/run_device_checks.sh runs them on a GPU machine (one process,
and two on one GPU with distinct NCCL_HOSTID)."""
import pytest
import torch

from conftest import results, run_ranks

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: tests/gpu/run_device_checks.sh runs these on a GPU machine")

CUDA_ENV = {"LOWRANK_TEST_CUDA": "1"}


def hostid(r):
    return {"NCCL_HOSTID": f"lowrank-pytest-host{r}"}  # two ranks on one GPU: NCCL needs this


@pytest.mark.parametrize("world,k,start", [(1, 4, 0), (2, 2, 0), (2, 4, 2)])
def test_ddp_nccl_hook_equals_direct_allreduce(world, k, start):
    """CUDA buckets: the hook's output equals lowrank's NCCL communicator driven directly on the
    same inputs, bit for bit; every compressible bucket compressed; state for the live buckets."""
    res = results(run_ranks(world, "match", k, start, 0, 1, env=CUDA_ENV, rank_env=hostid,
                            timeout=240))
    for r in res:
        assert r["mismatches"] == []
        assert r["compressed"] == r["want_compressed"] and r["want_compressed"]
        assert r["buffers"] == len(r["live"])
        assert r["ratio"] > 10
