"""CI check of the training driver (studies/train/train.py), issue 12 item 4: a 2-worker DDP run over
gloo of the digits CNN for 3 epochs with DDP's exact allreduce and with lowrank's hook at rank 4,
in the same test session: lowrank's final test accuracy at least allreduce's minus 3 points, every
compressible bucket compressed, compression ratio above 10. Plus a 1-epoch run of PyTorch's hook
through the driver's chained wrapper (two buckets over gloo) and a short transformer run.

Run by meson (tests/studies/meson.build) under the configured torch Python, or by hand:
  /usr/bin/python3 -m pytest -q tests/studies
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from studies.lib import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = launch.module(sys.executable, "studies.train.train")  # with launch.env()

EPOCHS = 3
COMMON = ["--spawn", "2", "--model", "cnn", "--batch", "32", "--epochs", str(EPOCHS),
          "--start-iter", "2", "--seed", "0", "--timeout", "60"]


def drive(tmp, name, *args, deadline=150):
    """Runs the driver; returns its JSON. The driver and its forked workers run in their own
    session, killed together at the deadline."""
    out = os.path.join(tmp, name + ".json")
    p = subprocess.Popen([*DRIVER, *args, "--out", out], stdout=subprocess.PIPE, env=launch.env(),
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = p.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        pytest.fail(f"{name}: no result within {deadline} s:\n{text[-3000:]}")
    print(text)
    if p.returncode != 0 or not os.path.exists(out):
        pytest.fail(f"{name}: exit status {p.returncode}:\n{text[-3000:]}")
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("train"))
    return {"allreduce": drive(tmp, "allreduce", *COMMON, "--reducer", "allreduce"),
            "lowrank": drive(tmp, "lowrank", *COMMON, "--reducer", "lowrank", "--rank", "4")}


def test_lowrank_accuracy_within_3_points_of_allreduce(runs):
    exact = runs["allreduce"]["epochs"][-1]["test_accuracy"]
    low = runs["lowrank"]["epochs"][-1]["test_accuracy"]
    print(f"final test accuracy: allreduce {exact:.4f}, lowrank rank 4 {low:.4f}")
    assert len(runs["lowrank"]["epochs"]) == EPOCHS
    assert exact > 0.9, "full precision did not learn: the driver or data are broken"
    assert low >= exact - 0.03


def test_every_compressible_bucket_compressed(runs):
    res = runs["lowrank"]
    buckets = res["buckets"]
    assert buckets, "no bucket seen by lowrank's hook"
    assert sum(b["compressible"] for b in buckets) == res["config"]["powersgd_rule"]["compressed_tensors"]
    for b in buckets:
        v = b["view"]
        assert v is not None and v["planned"], f"bucket {b['index']} has no layout in lowrank"
        assert v["ntensors"] == len(b["shapes"])
        assert v["ncompressed"] == b["compressible"], b
        if b["compressible"]:
            assert v["approxRank"] == 4 and v["pElements"] > 0 and v["qElements"] > 0, b
    st = res["lowrank_stats"]
    total = res["config"]["total_steps"]
    steps_compressed = total - res["config"]["start_iter_effective"]
    assert st["compressedCalls"] == steps_compressed * len(buckets)
    assert st["fallbackCalls"] == 0


def test_compression_ratio_above_10(runs):
    res = runs["lowrank"]
    assert res["lowrank_stats"]["ratio"] > 10
    # Bits: lowrank's measured bytes within 1% of the message-size model (P, Q and exact parts).
    for e in res["epochs"]:
        assert abs(e["bits"] - e["bits_model"]) <= 0.01 * e["bits_model"], e
    exact_bits = runs["allreduce"]["epochs"][-1]["bits"]
    assert res["epochs"][-1]["bits"] * 10 < exact_bits


def test_json_record(runs):
    lib = os.environ.get("LOWRANK_LIBRARY")
    for res in runs.values():
        assert res["machine"]["torch"] and res["config"]["world"] == 2
        # provenance (studies/lib/provenance.py): the worker's own library, the versions, UTC times
        rec = res["provenance"]
        assert rec["library"] is not None, rec.get("library_error")
        if lib:
            assert rec["library"]["library"] == os.path.realpath(lib)
        assert rec["torch"] == res["machine"]["torch"] and rec["describe"] == res["machine"]["git"]
        assert rec["started_utc"] <= rec["ended_utc"] and rec["ended_utc"].endswith("+00:00")
        for e in res["epochs"]:
            assert len(e["batch_ms"]) == e["steps"] == res["config"]["steps_per_epoch"]
            assert e["batch_ms_mean"] > 0 and e["train_loss"] > 0


def test_powersgd_rule_matches_pytorch():
    """The driver's bit count for torch-powersgd uses PyTorch's per-tensor rule."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress
    import numpy as np
    from studies.train import charlm
    from studies.train import digits
    from studies.train import train
    for model in (digits.DigitsCNN(), charlm.CharTransformer()):
        shapes = [list(p.shape) for p in model.parameters()]
        for k in (1, 2, 4, 8):
            pq, exact, ncomp, total = train.powersgd_split(shapes, k)
            want_pq = want_exact = want_n = 0
            for s in shapes:
                n = s[0]
                m = int(np.prod(s)) // n
                kk = min(n, m, k)
                if _should_compress(n, m, kk, 2)[0]:
                    want_pq, want_n = want_pq + (n + m) * kk, want_n + 1
                else:
                    want_exact += n * m
            assert (pq, exact, ncomp) == (want_pq, want_exact, want_n)


def test_evaluations_every_quarter_epoch(runs, tmp_path):
    """--evals-per-epoch 4 (the time-to-accuracy study's): a point after each quarter of every
    epoch, its train_s the training time so far with every evaluation left out, the epoch's last
    point its record's; the same training as the run evaluated once per epoch (the fixture's)."""
    res = drive(str(tmp_path), "quarters", *COMMON, "--reducer", "allreduce",
                "--evals-per-epoch", "4")
    once, steps = runs["allreduce"], res["config"]["steps_per_epoch"]
    assert len(once["evals"]) == EPOCHS and len(res["evals"]) == 4 * EPOCHS
    assert [e["step"] for e in res["evals"]] == [(ep - 1) * steps + round(steps * j / 4)
                                                for ep in range(1, EPOCHS + 1) for j in range(1, 5)]
    total = 0.0
    for ep, rec in enumerate(res["epochs"], 1):
        points = [e for e in res["evals"] if e["epoch"] == ep]
        total += rec["train_s"]
        assert points[-1]["train_s"] == pytest.approx(total)
        assert points[-1]["test_accuracy"] == rec["test_accuracy"]
        # the epoch's wall time holds its 4 evaluations; its training time none of them
        assert rec["epoch_s"] - rec["train_s"] >= sum(e["eval_s"] for e in points) > 0
    assert all(a["train_s"] < b["train_s"] for a, b in zip(res["evals"], res["evals"][1:]))
    assert [e["train_loss"] for e in res["epochs"]] == pytest.approx(
        [e["train_loss"] for e in once["epochs"]], rel=1e-6)


def test_torch_powersgd_wrapped_two_buckets(tmp_path):
    """PyTorch's hook through the driver's chained wrapper (torch_baseline.py), over gloo with the
    CNN's two buckets."""
    res = drive(str(tmp_path), "torch-powersgd", "--spawn", "2", "--model", "cnn", "--batch", "32",
                "--epochs", "1", "--start-iter", "2", "--reducer", "torch-powersgd", "--rank", "4",
                "--timeout", "60")
    assert res["config"]["torch_powersgd_wrapper"] == "chained"
    assert res["torch_powersgd_stats"]["compress_rate"] > 10
    assert res["epochs"][0]["test_accuracy"] > 0.5


def test_transformer_short(tmp_path):
    """The character-level transformer through lowrank's hook: a few steps, the loss falls below
    uniform's (ln 128 = 4.85)."""
    res = drive(str(tmp_path), "transformer", "--spawn", "2", "--model", "transformer",
                "--windows", "256", "--batch", "16", "--epochs", "1", "--start-iter", "2",
                "--reducer", "lowrank", "--rank", "2", "--timeout", "60")
    assert res["epochs"][0]["test_loss"] < 4.0
    assert all(b["view"]["ncompressed"] == b["compressible"] for b in res["buckets"])


def test_study_options(tmp_path):
    """The options of issue 28's study (studies/rank/run.py) reach lowrank: embeddings and head
    exact, compression from a fraction of the steps, an adaptive rank whose ks are recorded, and the
    bits of the compressed steps alone."""
    res = drive(str(tmp_path), "options", "--spawn", "2", "--model", "transformer",
                "--windows", "256", "--batch", "4", "--epochs", "1", "--reducer", "lowrank",
                "--rank", "2", "--exclude", "embeddings-head", "--start-frac", "0.25",
                "--adaptive", "2:8", "--adaptive-window", "8", "--timeout", "60")
    c = res["config"]
    assert c["start_iter_effective"] == round(0.25 * c["total_steps"]) == 8
    trace = res["rank_trace"]
    assert trace[0][0] == 0 and all(k == 0 for k in trace[0][1].values())  # the warm-up: exact
    last = trace[-1][1]
    for name in ("tok.weight", "pos.weight", "head.weight"):
        assert last[name] == 0, (name, last)
    two_d = [n for n in last if n.endswith(("qkv.weight", "proj.weight", "ff1.weight", "ff2.weight"))]
    assert two_d and all(last[n] in (2, 8) for n in two_d), last
    assert 0 < res["bits_after_warmup"] < res["epochs"][-1]["bits_cumulative"]
    # the signals each decision took: every measured step once, one (norm, error) per matrix
    # under the rule, the error a fraction
    sig = res["signal_trace"]
    assert [m for m, _ in sig] == sorted({m for m, _ in sig}) and sig, sig
    assert all(m % 8 == 7 for m, _ in sig)
    assert set(sig[-1][1]) == set(two_d), sig[-1]  # only the matrices the rule rules
    assert all(sig[-1][1][p][0] > 0 and 0 <= sig[-1][1][p][1] <= 1 for p in two_d), sig[-1]


def test_rank_of_reaches_lowrank(tmp_path):
    """--rank-of gives a parameter its own k: the view shows it at that k (or exact for 0), the
    others at --rank."""
    res = drive(str(tmp_path), "rankof", "--spawn", "2", "--model", "transformer",
                "--windows", "256", "--batch", "16", "--epochs", "1", "--start-iter", "2",
                "--reducer", "lowrank", "--rank", "2", "--rank-of", "head.weight=5,pos.weight=0",
                "--adaptive", "2:3", "--timeout", "60")
    last = res["rank_trace"][-1][1]
    assert last["head.weight"] == 5 and last["pos.weight"] == 0, last
    assert last["tok.weight"] in (2, 3) and last["blocks.0.qkv.weight"] in (2, 3), last


@pytest.mark.parametrize("argv, word", [
    (["--reducer", "lowrank", "--rank-of", "head.weight"], "NAME=K"),
    (["--reducer", "lowrank", "--rank-of", "head.weight=x"], "NAME=K"),
    (["--reducer", "lowrank", "--rank-of", "head.weight=-1"], "NAME=K"),
    (["--reducer", "lowrank", "--rank-of", "=4"], "NAME=K"),
    (["--reducer", "lowrank", "--rank-of", "embeddings-head=4"], "transformer"),
    (["--model", "transformer", "--reducer", "lowrank", "--rank-of",
      "embeddings-head=4,tok.weight=2"], "named twice"),
    (["--reducer", "allreduce", "--rank-of", "x=1"], "options of --reducer lowrank"),
    (["--reducer", "lowrank", "--exclude", "head.weight", "--rank-of", "head.weight=4"], "one"),
    (["--reducer", "lowrank", "--rank", "0", "--rank-of", "head.weight=4"], "rank > 0"),
    (["--model", "transformer", "--optimizer", "sgd"], "--lr"),
    (["--reducer", "allreduce", "--exclude", "x"], "options of --reducer lowrank"),
    (["--reducer", "lowrank-exact", "--alternate"], "options of --reducer lowrank"),
    (["--reducer", "lowrank", "--exclude", "embeddings-head"], "transformer"),
    (["--reducer", "lowrank", "--rank", "16", "--adaptive", "2:8"], "LOW..HIGH"),
    (["--reducer", "lowrank", "--adaptive", "2-8"], "LOW:HIGH"),
    (["--reducer", "lowrank", "--rank", "2", "--adaptive", "2:8", "--adaptive-window", "0"], "at least 1"),
    (["--reducer", "lowrank", "--start-iter", "5", "--start-frac", "0.1"], "give one"),
    (["--reducer", "lowrank", "--start-frac", "1.0"], "[0, 1)"),
    (["--reducer", "lowrank", "--adaptive", "2:8", "--rank", "2", "--adaptive-error-max", "x"], "'none'"),
])
def test_study_options_refused(argv, word, capsys):
    from studies.train import train
    with pytest.raises(SystemExit):
        train.parse(argv)
    assert word in capsys.readouterr().err


def test_exclude_expands_embeddings_head_in_a_list():
    from studies.train import train
    args = train.parse(["--model", "transformer", "--reducer", "lowrank",
                        "--exclude", "embeddings-head,blocks.0.qkv.weight"])
    assert args.exclude.split(",") == ["tok.weight", "pos.weight", "head.weight", "blocks.0.qkv.weight"]
    assert args.start_iter == 10 and args.optimizer == "adamw"


def test_rank_of_expands_embeddings_head():
    from studies.train import train
    args = train.parse(["--model", "transformer", "--reducer", "lowrank",
                        "--rank-of", "embeddings-head=16,blocks.0.qkv.weight=0"])
    assert args.rank_of == [["tok.weight", 16], ["pos.weight", 16], ["head.weight", 16],
                            ["blocks.0.qkv.weight", 0]]


def test_no_compressed_step_is_an_error_with_its_message():
    """A start at or past the last step would compress nothing: each worker's SystemExit text
    reaches the output (forked workers used to exit 1 silently)."""
    p = subprocess.run([*DRIVER, "--spawn", "2", "--model", "transformer", "--windows",
                        "256", "--batch", "16", "--epochs", "1", "--reducer", "lowrank", "--rank", "2",
                        "--start-frac", "0.99", "--timeout", "60"],
                       capture_output=True, text=True, timeout=120, env=launch.env())
    assert p.returncode != 0
    assert "no step would be compressed" in p.stdout + p.stderr
