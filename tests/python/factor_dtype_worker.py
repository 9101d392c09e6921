"""One rank of tests/python/test_hook_factor_dtype.py (started with torchrun's variables): DDP over
gloo with lowrank's hook and PowerSGDState(factor_dtype=...). Prints "RESULT <json>" at the end.

    factor_dtype_worker.py train STEPS START   the same data and initial model trained STEPS steps
                                               with factor_dtype "fp32" and with "bf16"; then the
                                               bf16 run's state_dict loaded into a state with
                                               "fp32", which trains 2 steps more
    factor_dtype_worker.py mismatch            one synthetic bucket; rank 0 "bf16", the others
                                               "fp32": every rank must raise

Per run and step: lowrank's bytesSent and compressedCalls added by the step, the loss, and a
digest of the reduced buffer.
"""
import datetime
import hashlib
import io
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
from buckets import SyntheticBucket  # noqa: E402
from lowrank.torch import PowerSGDState, powerSGD_hook  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
K = 2


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class Net(nn.Module):
    """Two (96, 96) weights and no 1-D parameter: every compressed step sends factors
    ((96 + 96) k floats per weight) and nothing exact but lowrank's few check elements."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(96, 96, bias=False)
        self.fc2 = nn.Linear(96, 96, bias=False)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def run(factor_dtype, steps, start, params=None, saved=None):
    """Trains `steps` steps; returns (the record, the state's state_dict, the model's params)."""
    torch.manual_seed(1234)
    model = Net()
    if params is not None:
        model.load_state_dict(params)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = PowerSGDState(None, matrix_approximation_rank=K, start_powerSGD_iter=start,
                          random_seed=5, timeout=30, factor_dtype=factor_dtype)
    if saved is not None:
        state.load_state_dict(saved)
    outs = []

    def spy(st, bucket):
        def seen(fut):
            t = fut.value()
            outs.append(hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()[:16])
            return t
        return powerSGD_hook(st, bucket).then(seen)
    ddp.register_comm_hook(state, spy)
    g = torch.Generator().manual_seed(100 + RANK)  # the same batch at every step; ranks differ
    x, y = torch.randn(32, 96, generator=g), torch.randn(32, 96, generator=g)
    losses, sent, compressed = [], [], []
    before = state.stats()
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        now = state.stats()
        sent.append(now["bytesSent"] - before.get("bytesSent", 0))
        compressed.append(now["compressedCalls"] - before.get("compressedCalls", 0))
        before = now
    sd = state.state_dict()
    buf = io.BytesIO()  # saved and loaded as a checkpoint is
    torch.save(sd, buf)
    buf.seek(0)
    out = dict(outs=outs, losses=losses, sent=sent, compressed=compressed,
               config=state.communicator("cpu").config()["factor_dtype"],
               option=sd["options"]["factor_dtype"],
               finite=all(bool(torch.isfinite(p).all()) for p in model.parameters()))
    state.close()
    return out, torch.load(buf), {n: p.detach().clone() for n, p in model.state_dict().items()}


def mismatch():
    """Rank 0 sends bf16 factors, the others fp32: the first compressed call raises everywhere."""
    dtype = "bf16" if RANK == 0 else "fp32"
    state = PowerSGDState(None, matrix_approximation_rank=K, start_powerSGD_iter=0, timeout=20,
                          factor_dtype=dtype)
    buf = torch.randn(64 * 32 + 10, generator=torch.Generator().manual_seed(RANK))
    try:
        powerSGD_hook(state, SyntheticBucket(0, buf, [(64, 32), (10,)])).wait()
        result(raised=None)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        result(raised=type(e).__name__, message=str(e)[:400])
    state.close()


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    if what == "train":
        steps, start = args
        fp32, _, _ = run("fp32", steps, start)
        bf16, saved, params = run(torch.bfloat16, steps, start)
        resumed, _, _ = run("fp32", 2, start, params=params, saved=saved)
        result(fp32=fp32, bf16=bf16, resumed=resumed)
    else:
        mismatch()
    dist.barrier()
    dist.destroy_process_group()
