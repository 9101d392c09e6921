"""lowrank.torch.fsdp: PowerSGD as FSDP2's all-reduce hook under HSDP, 4 processes over gloo
(2 replicas x 2 shards, tests/python/fsdp_worker.py). Torch without FSDP2 (Debian's 1.13): the
import raises ImportError saying so, and the multi-process tests skip with that reason."""
import importlib

import pytest
import torch

from conftest import BAD_SETTINGS, results, run_ranks


def _has_fsdp2():
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:  # noqa: BLE001 - Debian's 1.13 on Python 3.11 raises ValueError here
        return False
    return hasattr(FSDPModule, "set_all_reduce_hook")


try:
    importlib.import_module("lowrank.torch.fsdp")
    NO_FSDP2 = None
except ImportError as e:
    NO_FSDP2 = str(e)
needs_fsdp2 = pytest.mark.skipif(NO_FSDP2 is not None, reason=str(NO_FSDP2))
WORLD, W = 4, "fsdp_worker.py"


def test_import_says_what_is_missing():
    """Where torch has FSDP2's all-reduce hook the module imports; elsewhere (torch 1.13) the
    ImportError names what is missing and this torch's version."""
    if _has_fsdp2():
        assert NO_FSDP2 is None
        return
    assert NO_FSDP2 is not None
    assert "set_all_reduce_hook" in NO_FSDP2 and torch.__version__ in NO_FSDP2


@needs_fsdp2
@pytest.mark.parametrize("k,start", [(0, 0), (2, 100)])
def test_exact_equals_native_hsdp(k, start):
    """No compression (k = 0; or k = 2 still in its warm-up): after every step each rank's
    parameter shards equal native HSDP's on a 2-D mesh, bit for bit (2 replicas: a + b is the same
    sum in either order, and lowrank's exact average divides by 2 as gloo's does), while the
    parameters did move and the ranks' data differ."""
    for r in results(run_ranks(WORLD, "native", k, start, timeout=150, worker=W)):
        assert r["diffs"] == [0.0] * len(r["diffs"]) and r["diffs"], r
        assert r["moved"] > 0 and r["calls"] > 0 and r["compressed"] == 0
        assert "Replicate" in r["placements"] and "Shard(dim=0)" in r["placements"]


@needs_fsdp2
@pytest.mark.parametrize("k,start", [(2, 1), (1, 0)])
def test_compressed_equals_direct_allreduce(k, start):
    """With compression, each group's reduced flat shard equals a Communicator with the same
    settings driven directly on a copy of the same input, declared with a layout derived in the
    worker from a plain model (FSDP's order, torch.chunk's rows, the documented ids): bit for
    bit, every rank, every group, every step."""
    for r in results(run_ranks(WORLD, "match", k, start, timeout=150, worker=W)):
        assert r["mismatches"] == [] and r["compared"] == r["groups"] * r["steps"], r
        assert r["groups"] == 3 and r["layout_same"] and r["sizes_same"], r
        assert r["compressed"] > 0 and r["ratio"] > 1.5, r
        assert r["factor_dtype"] == "fp32", r


@needs_fsdp2
def test_bf16_factors_equal_direct_allreduce():
    """factor_dtype="bf16" reaches lowrank: each group's reduced flat shard equals a Communicator
    made with factor_dtype "bf16" driven directly on the same input, bit for bit (a hook that
    sent float32 factors would differ: the wire rounds them), and the communicator reports
    it."""
    for r in results(run_ranks(WORLD, "match_bf16", 2, 1, timeout=150, worker=W)):
        assert r["mismatches"] == [] and r["compared"] == r["groups"] * r["steps"], r
        assert r["compressed"] > 0 and r["factor_dtype"] == "bf16", r


@needs_fsdp2
def test_empty_and_uneven_shards():
    """1 replica x 4 shards: a 5-row head (rows 2, 2, 1, 0: shard 3 is padding only) and 7-element
    scale map, and the hook at k = 0 changes nothing (the same shards as without a hook)."""
    res = results(run_ranks(WORLD, "shards4", timeout=150, worker=W))
    assert [r["rows"]["head.weight"] for r in res] == [2, 2, 1, 0]
    assert [r["rows"]["scale"] for r in res] == [2, 2, 2, 1]
    for r in res:
        assert r["same"] and r["calls"] > 0, r


@needs_fsdp2
def test_gradient_accumulation():
    """set_requires_gradient_sync(False) on the accumulation micro-batches: no hook call there,
    one per group at the synchronizing one; sync at every micro-batch: one per group each."""
    for r in results(run_ranks(WORLD, "accum", timeout=150, worker=W)):
        g, m = r["groups"], r["micro"]
        assert r["nosync"] == ([0] * (m - 1) + [g]) * (len(r["nosync"]) // m), r
        assert r["sync"] == [g] * len(r["sync"]) and g == 3, r


@needs_fsdp2
def test_checkpoint_resumes_bit_for_bit(tmp_path):
    """6 steps uninterrupted, saving after 3 FSDP's sharded state (model, SGD momentum) by
    torch.distributed.checkpoint and the hook's state by torch.save per rank; new processes
    load both and train the last 3: every rank's shards equal the uninterrupted run's bit for
    bit. Without the hook's state they differ (the residuals and Q matter)."""
    path = str(tmp_path)
    full = results(run_ranks(WORLD, "ckpt", "save", path, timeout=150, worker=W))
    resumed = results(run_ranks(WORLD, "ckpt", "resume", path, timeout=150, worker=W))
    nohook = results(run_ranks(WORLD, "ckpt", "nohook", path, timeout=150, worker=W))
    for f, r, n in zip(full, resumed, nohook):
        assert f["held"] > 0 and r["loaded"] == f["held"]
        assert r["digest"] == f["digest"]
        assert n["digest"] != f["digest"]
        assert r["compressed"] > 0


@needs_fsdp2
@pytest.mark.parametrize("first", [3, 2])
def test_alternate_resumes_bit_for_bit(tmp_path, first):
    """alternate=True (alternating PowerSGD), as test_checkpoint_resumes_bit_for_bit: saved
    after 3 steps (2 compressed calls: a P step next) or 2 (1: a Q step next), the restart's
    shards after 3 more steps equal the uninterrupted run's bit for bit on every rank. Every
    compressed step of either run adds to lowrank's payload, over the groups with a compressed
    tensor, their exact part and one factor: P at the 1st, 3rd, ... compressed call, Q at the
    others (P and Q differ in size here); the communicator reports alternate 1."""
    path, env = str(tmp_path), {"FSDP_ALTERNATE": "1", "FSDP_CKPT_FIRST": str(first)}
    full = results(run_ranks(WORLD, "ckpt", "save", path, timeout=150, worker=W, env=env))
    resumed = results(run_ranks(WORLD, "ckpt", "resume", path, timeout=150, worker=W, env=env))
    start = 1  # fsdp_ckpt.START: step 0 exact
    for f, r in zip(full, resumed):
        assert f["held"] > 0 and r["loaded"] == f["held"]
        assert r["digest"] == f["digest"]
        assert f["alternate"] == r["alternate"] == 1
        for run, offset in ((f, 0), (r, first)):
            for i, (paid, (p, q, e)) in enumerate(zip(run["payload"], run["factors"])):
                calls = offset + i - start  # compressed calls before this step
                if calls < 0:
                    continue
                assert p and q and p != q, run["factors"]
                assert paid == e + (p if calls % 2 == 0 else q), (offset + i, run)


@needs_fsdp2
def test_replica_killed_mid_step():
    """Rank 3 (replica 1, shard 1) is SIGKILLed in its hook at step 3: every other rank raises
    within lowrank's timeout (5 s, gloo's the same) + 10 s; none hangs. Rank 1, its replica peer,
    raises from the hook, naming it by both ranks: comm rank 1 of the replica group {1, 3},
    global rank 3."""
    runs = run_ranks(WORLD, "peer_death", 3, timeout=90, worker=W)
    assert runs[3][0] == -9
    for rank, (rc, res, text, _) in enumerate(runs[:3]):
        assert rc == 0 and res is not None, text[-2000:]
        print(f"rank {rank} after {res['after']:.1f} s: {res['raised']}: {res['message'][:160]}")
        assert res["raised"], res
        assert res["after"] < 5 + 10, res
    res = runs[1][1]
    assert res["raised"] == "LowrankError", res
    assert "comm rank 1 of the replica group (global rank 3)" in res["message"], res


def test_comm_ranks_named_with_their_global_ranks():
    """with_global_ranks: each "comm rank N" of a lowrank message gets its global rank, the group
    named once; the class and code stay; a message without a rank is the same error."""
    from lowrank.errors import InvalidArgumentError, LowrankError
    from lowrank.torch.process_group import with_global_ranks
    e = LowrankError(6, "ucx: collective #9: comm rank 1 disconnected while comm rank 0 waited "
                        "on it (...; UCX: Endpoint timeout)", "lowrankAllReduce")
    got = with_global_ranks(e, [1, 3], "replica group")
    assert type(got) is LowrankError and (got.code, got.function) == (6, "lowrankAllReduce")
    assert got.message == ("ucx: collective #9: comm rank 1 of the replica group (global rank 3) "
                           "disconnected while comm rank 0 (global rank 1) waited on it (...; "
                           "UCX: Endpoint timeout)")
    got = with_global_ranks(LowrankError(2, "ucx: comm rank 0 of 2: setup"), [5, 7], "group")
    assert got.message == "ucx: comm rank 0 of 2 in the group (global rank 5): setup"
    bad = InvalidArgumentError(4, "comm ranks disagree")
    assert with_global_ranks(bad, [0, 2], "group") is bad


@needs_fsdp2
def test_clear_errors_and_divide_factor():
    """One process: a model without fully_shard, native HSDP's 2-D mesh, a Shard(1) placement
    (each naming the parameter and the torch version where it is about the layout; a refused
    register sets no hook), a load before register, a malformed state dict, a root left unsharded
    (its parameters outside every FSDPModule), a second register on one state (the same model or
    another), a step where parameters get no gradient (the size check), a closed state; FSDP's
    divide factor turns the hook's average into a sum (native HSDP's convention)."""
    r = results(run_ranks(1, "errors", timeout=90, worker=W))[0]
    assert r["plain"].startswith("ValueError") and "no FSDPModule" in r["plain"], r
    assert "mesh has 2 dimensions" in r["mesh2d"] and torch.__version__ in r["mesh2d"], r
    assert "Shard(dim=1)" in r["shard1"] and torch.__version__ in r["shard1"], r
    assert "handed the hook" in r["unused"] and "set_reduce_scatter_unused_params" in r["unused"]
    assert r["unused_fixed"] is None, r
    assert "closed" in r["closed"], r
    assert r["units_after_refusal"] == 0, "a refused register leaves no hook behind"
    assert "call register(model, state) first" in r["load_before_register"], r
    assert r["malformed"].startswith("ValueError") and "not a state_dict()" in r["malformed"], r
    assert "outside every FSDPModule" in r["outside"] and "scale" in r["outside"], r
    assert "serves a model already" in r["twice"], r
    assert "serves a model already" in r["second_model"], r
    assert (r["op"], r["op_factor"]) == ("avg", "sum"), r


@needs_fsdp2
@pytest.mark.parametrize("kwargs,error,message", BAD_SETTINGS)
def test_settings_are_checked_as_the_ddp_hooks(kwargs, error, message):
    """Each setting the FSDP2 hook shares with the DDP hook is checked by the same rule
    (lowrank.torch.settings), before torch.distributed is needed."""
    from lowrank.torch import fsdp
    with pytest.raises(error) as e:
        fsdp.PowerSGDState(None, **kwargs)
    assert message in str(e.value)
