"""lowrank.torch under DDP over gloo, ranks as processes (tests/python/ddp_worker.py)."""
import statistics

import pytest

from conftest import results, run_ranks

STEPS = 8  # ddp_worker.match's default


@pytest.mark.parametrize("world,k,start,unused", [(2, 2, 0, 0), (3, 4, 2, 0), (2, 4, 1, 1),
                                                  (3, 1, 0, 1)])
def test_hook_equals_direct_allreduce(world, k, start, unused):
    """Each bucket's averaged gradients equal lowrankAllReduce driven directly on copies of the
    bucket's input, declared with the bucket's parameters' ids and shapes: bit for bit, every
    rank, the warm-up included, which is lowrank's exact allreduce (startIter), not the process
    group's (its all_reduce is never called)."""
    res = results(run_ranks(world, "match", k, start, unused))
    for r in res:
        assert r["mismatches"] == []
        assert r["group_allreduces"] == 0 and r["config_start_iter"] == start
        assert r["warmup_diff"] < 1e-6  # the exact average, to float32 rounding
        assert r["calls_total"] == sum(r["bucket_counts"])  # every bucket every step, by lowrank
        assert r["compared"] == sum(r["bucket_counts"])
        assert len(r["live"]) >= 2, "the model must span several buckets"
        # every bucket with a compressible tensor was compressed, and each compressed step counted
        assert r["compressed"] == r["want_compressed"] and r["want_compressed"]
        assert r["compressed_calls"] == sum(
            c for s, c in enumerate(r["bucket_counts"]) if s >= start) - \
            (STEPS - start) * len(r["exact_live"])
        # lowrank holds state for exactly the live buckets (none left at rebuilt-away buffers)
        assert r["buffers"] == len(r["live"])
        assert r["ratio"] > 10  # from the first compressed step on (the warm-up is exact)
        if not unused:
            assert r["rebuilt"], "DDP rebuilt no bucket: the reset on rebuild went untested"
    assert all(r["live"] == res[0]["live"] for r in res)


@pytest.mark.parametrize("k", [1, 4])
def test_error_against_pytorch_hook(k):
    """Same real gradients (perf/data/digits_cnn, 4 workers), both hooks driven directly, 8 seeds:
    lowrank's first-call error within PyTorch's mean +- 2 standard errors, and its cumulative
    error after 10 calls at most 1.05x PyTorch's."""
    res = results(run_ranks(4, "vs_torch", k, timeout=300))[0]
    t, l = res["torch"], res["lowrank"]
    mean_t, se_t = statistics.mean(t["first"]), statistics.stdev(t["first"]) / len(t["first"]) ** 0.5
    mean_l = statistics.mean(l["first"])
    print(f"k={k} first call: torch {mean_t:.4f} +- {se_t:.4f}, lowrank {mean_l:.4f}; "
          f"after 10: torch {statistics.mean(t['cum']):.4f}, lowrank {statistics.mean(l['cum']):.4f}")
    assert len(t["first"]) == len(l["first"]) == 8
    assert abs(mean_l - mean_t) <= 2 * se_t + 1e-12
    assert statistics.mean(l["cum"]) <= 1.05 * statistics.mean(t["cum"])


def test_peer_killed_mid_step():
    """Rank 2 is SIGKILLed inside its hook at step 4: the others raise within lowrank's timeout
    (5 s) + 10 s, none hangs, and each then exits normally (status 0, no abort at teardown)."""
    runs = run_ranks(3, "peer_death", 2, timeout=60)
    assert runs[2][0] == -9
    for rc, res, text, _ in runs[:2]:
        assert rc == 0, text[-2000:]
        assert res["raised"], res
        assert res["after"] < 5 + 10, res
        assert "lowrank" in res["message"], res


@pytest.mark.parametrize("world", [2, 3])
def test_bucket_shapes_differ_across_ranks(world):
    """Rank 0's bucket has other shapes (same element count): every rank raises."""
    for r in results(run_ranks(world, "shapes", timeout=90)):
        assert r["raised"], r
        assert "lowrankInvalidUsage" in r["message"] and "disagree" in r["message"], r


def test_bad_use_is_a_clear_exception():
    """torch.distributed not initialized; a non-contiguous, complex or mixed-device bucket: each
    raises a clear exception, and the hook works afterwards in the same process."""
    runs = run_ranks(1, "bad_use", timeout=90, env={"LOWRANK_START_ITER": "5"})
    res = results(runs)[0]
    notinit = [line for line in runs[0][2].splitlines() if line.startswith("NOTINIT ")][0]
    assert '"code": 5' in notinit and "init_process_group" in notinit
    assert "not contiguous" in res["non_contiguous"]["message"]
    assert res["non_contiguous"]["type"] == "InvalidArgumentError"
    assert "complex64" in res["dtype"]["message"]
    assert "mixes devices" in res["mixed_device"]["message"]
    # the hook counts the warm-up itself: LOWRANK_START_ITER does not delay it further
    assert res["after"] == {"finite": True, "stats": 1, "start_iter": 0}
    assert "one PowerSGDState serves one DDP model" in res["two_models"]
    assert "closed" in res["closed"] and res["closed_stats"] == [{}, [0.0, 0, 0]]


@pytest.mark.parametrize("world", [2, 3])
def test_communicator_from_env_and_from_process_group_agree(world):
    for r, res in enumerate(results(run_ranks(world, "from_env", timeout=90, launch="exec"))):
        assert res == {"same": True, "size": world, "rank": r, "compressed": 1}
