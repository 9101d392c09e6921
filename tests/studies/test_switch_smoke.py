"""Smoke runs of the switching driver (studies/switch/driver.py, issue 27 item 2): 2 ranks over gloo,
eight reducers (REDUCERS: lowrank four times: the measured choice of algorithm, the ring forced,
bf16 factors, and alternating with bf16 factors), 3 steps a block. Checks what a switching run must get right whatever the
machine's load (no time is judged): the blocks in switch_design's order on every rank, replicas
identical at the end, each step's records, and the socket payload of each reducer's measured
blocks (bytes sent less TCP's retransmissions, which a loaded loopback does make) within 5% of its
model once the floor (`local`'s bytes: DDP's broadcast of the BatchNorm buffers) is taken off.
At 2 ranks every allreduce algorithm sends each buffer once, so the model is exact there but for
gloo's framing, about 0.6 KB per allreduce here: 4% of PyTorch's PowerSGD's bytes for the CNN,
whose six allreduces a step (three per bucket) carry 84 KB. A second run, at 4 ranks, checks the
bytes where the algorithms differ (test_socket_bytes_at_4_ranks).
"""
import json
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
from studies.lib import launch
from studies.switch import design as switch_design
from studies.train import switch_hook

BLOCK, WARMUP, RUN_INDEX = 3, 3, 1
REDUCERS = ["local", "allreduce", "fp16", "torch-powersgd", "lowrank", "lowrank-ring", "lowrank-bf16",
            "lowrank-alternate-bf16"]


def run_switch(out, world):
    cmd = [*launch.module(sys.executable, "studies.switch.driver"), "--spawn", str(world),
           "--run-index", str(RUN_INDEX), "--block-steps", str(BLOCK), "--drop-steps", "1",
           "--warmup-steps", str(WARMUP), "--start-iter", "2", "--batch", "16",
           "--timeout", "60", "--reducers", ",".join(REDUCERS), "--out", out]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=launch.env())
    try:
        text, _ = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("switch.py: no result within 240 s:\n" + p.communicate()[0][-3000:])
    assert p.returncode == 0 and os.path.exists(out), text[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_switch(str(tmp_path_factory.mktemp("switch") / "run.json"), 2)


@pytest.fixture(scope="module")
def result4(tmp_path_factory):
    return run_switch(str(tmp_path_factory.mktemp("switch4") / "run.json"), 4)


def payloads(rank_record):
    """[(block, socket payload per step)] of one rank's measured blocks, `local`'s floor (DDP's
    broadcast of the BatchNorm buffers) taken off. An alternating reducer's blocks (3 steps: P Q P
    or Q P Q) are merged into one record of both (6 steps in a row: as many P as Q steps, the
    model's mean), its lowrank_bytes_sent their mean."""
    measured = [b for b in rank_record["blocks"] if not b["warmup"]]
    def payload(b):
        return (b["bytes"]["process"]["bytes_sent"] - b["bytes"]["process"]["bytes_retrans"]) / BLOCK
    floor = max(payload(b) for b in measured if b["reducer"] == "local")
    out, alternating = [], {}
    for b in measured:
        if "-alternate" in b["reducer"]:
            alternating.setdefault(b["reducer"], []).append(b)
        else:
            out.append((b, payload(b) - floor))
    for name, bs in alternating.items():
        assert len(bs) == 2, (name, len(bs))  # the row and its mirror
        merged = dict(bs[0], lowrank_bytes_sent=sum(b["lowrank_bytes_sent"] for b in bs) / len(bs))
        out.append((merged, sum(payload(b) for b in bs) / len(bs) - floor))
    return out


def test_order_and_records(result):
    names = REDUCERS
    want = [(n, True) for n in names] + [(n, False) for n in switch_design.block_order(names, RUN_INDEX)]
    assert result["config"]["order"] == [n for n, _ in want[len(names):]]
    assert len(result["ranks"]) == 2
    for r in result["ranks"]:
        assert [(b["reducer"], b["warmup"]) for b in r["blocks"]] == want
        for b in r["blocks"]:
            n = WARMUP if b["warmup"] else BLOCK
            for key in ("batch_ms", "hook_ms", "cpu_ms", "run_delay_ms", "loss"):
                assert len(b[key]) == n, key
            assert all(x > 0 for x in b["batch_ms"]) and all(x >= 0 for x in b["cpu_ms"])


def test_replicas_identical(result):
    assert result["replicas_identical"]


def test_trains(result):
    blocks = result["ranks"][0]["blocks"]
    assert blocks[-1]["loss"][-1] < blocks[0]["loss"][0]


def test_socket_bytes_match_models(result):
    for r in result["ranks"]:
        for b, per_step in payloads(r):
            if b["reducer"] == "local":
                continue
            model = b["model_bytes_per_step"]
            assert abs(per_step - model) <= 0.05 * model, (r["rank"], b["reducer"], per_step, model)
            if b["reducer"] in switch_hook.LOWRANK:  # lowrank's own counter, against the sockets
                assert abs(b["lowrank_bytes_sent"] / BLOCK - per_step) <= 0.05 * per_step
            else:
                assert b.get("lowrank_bytes_sent", 0) == 0


def test_socket_bytes_at_4_ranks(result4):
    """At 2 ranks every allreduce algorithm sends each buffer once, so a wrong model cannot show;
    at 4 they differ (issue 27: the check runs with 4 ranks). Per rank:
    - DDP's allreduce and fp16 (gloo's ring, 2(N-1)/N of the buffer): within 5% of the model;
    - the excess over the model is gloo's framing, paid per message: fp16's equals the allreduce's
      (the same two allreduces a step) and PyTorch's hook's is three times it (three allreduces
      per bucket: the exact part, P and Q), within 25%; it is why PyTorch's hook's bytes come out
      8% over its model on 4 hosts (docs/training.md);
    - lowrank's sockets within 5% of its own counter, and the counter between the ring's bytes
      and direct's ((N-1) of the buffer: N/2 times the ring's), the algorithms its cost model
      chooses between for these small messages."""
    world = len(result4["ranks"])
    assert world == 4 and result4["replicas_identical"]
    for r in result4["ranks"]:
        pay, model = {}, {}
        for b, per_step in payloads(r):
            pay.setdefault(b["reducer"], []).append(per_step)
            model[b["reducer"]] = b["model_bytes_per_step"]
        mean = {k: sum(v) / len(v) for k, v in pay.items()}
        for red in ("allreduce", "fp16"):
            assert abs(mean[red] - model[red]) <= 0.05 * model[red], (r["rank"], red, mean[red], model[red])
        excess = {red: mean[red] - model[red] for red in ("allreduce", "fp16", "torch-powersgd")}
        assert excess["allreduce"] > 0, excess
        assert excess["fp16"] == pytest.approx(excess["allreduce"], rel=0.25), excess
        assert excess["torch-powersgd"] == pytest.approx(3 * excess["allreduce"], rel=0.25), excess
        for b, _ in payloads(r):
            if b["reducer"] not in switch_hook.LOWRANK:
                continue
            red = b["reducer"]
            counted = b["lowrank_bytes_sent"] / BLOCK
            assert abs(counted - mean[red]) <= 0.05 * counted, (r["rank"], red, counted, mean[red])
            ring = model[red]
            # the ring forced sends the ring's bytes to the byte but for the payload's check words
            high = 1.01 * ring * (1 if red == "lowrank-ring" else world / 2)
            assert 0.99 * ring <= counted <= high, (r["rank"], red, counted, ring)


def test_transport_recorded(result):
    """Each lowrank reducer's communicator's transport_info() in the run's JSON: the ring-forced
    one says so, and ran the ring at every size it saw."""
    ring, chosen = result["lowrank_ring_transport"], result["lowrank_transport"]
    assert ring["choice"] == "forced" and chosen["choice"] != "forced", (ring, chosen)
    assert ring["algorithms"] and set(ring["algorithms"].values()) == {"ring"}, ring
    assert result["lowrank_ring_stats"]["compressedCalls"] > 0


def test_provenance_of_the_worker(result):
    """The record of studies/lib/provenance.py, made by rank 0's own process (the library it ran)."""
    rec = result["provenance"]
    assert rec["library"] is not None, rec.get("library_error")
    assert rec["describe"] == result["machine"]["git"] and rec["torch"] == result["machine"]["torch"]
    assert rec["started_utc"] <= rec["ended_utc"]
