"""One rank of tests/python/test_hook_alternate.py (started with torchrun's variables): DDP over
gloo with lowrank's hook, trained twice on the same data from the same initial model, with
alternate=True (alternating PowerSGD) and alternate=False. Prints "RESULT <json>" at the end.

    alternate_worker.py train STEPS START

Per run and step: a digest of every bucket's reduced buffer (by bucket index), the loss, lowrank's
payloadElements and compressedCalls added by the step, and the factor sizes of the step's
buckets (Communicator.view: pElements, qElements, exactElements per compressed call; a bucket
with nothing compressed: its element count, allreduced exactly).
"""
import datetime
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
from lowrank.torch import PowerSGDState, powerSGD_hook  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
K, CAP = 2, 0.002  # bucket_cap_mb: about 500 floats, so each weight closes a bucket of its own


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class Net(nn.Module):
    """Weights of (48, 24) and (16, 48): n != m, so P (n k) and Q (m k) differ in size."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(24, 48)
        self.fc2 = nn.Linear(48, 16)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def run(alternate, steps, start):
    torch.manual_seed(1234)
    model = Net()
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(CAP * 2**20)  # torch 1.13's first bucket: 1 MiB
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=CAP)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = PowerSGDState(None, matrix_approximation_rank=K, start_powerSGD_iter=start,
                          random_seed=5, timeout=30, alternate=alternate)
    outs, sizes = {}, {}

    def spy(st, bucket):
        step, index, n = st.iter, bucket.index(), bucket.buffer().numel()

        def seen(fut):
            t = fut.value()
            outs.setdefault(step, {})[index] = \
                hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()[:16]
            sizes.setdefault(step, {})[index] = n
            return t
        return powerSGD_hook(st, bucket).then(seen)
    ddp.register_comm_hook(state, spy)
    g = torch.Generator().manual_seed(100 + RANK)  # the same batch at every step; ranks differ
    x = torch.randn(32, 24, generator=g)
    y = torch.randn(32, 16, generator=g)
    losses, payload, compressed, factors = [], [], [], []
    before = state.stats()
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        now = state.stats()
        payload.append(now["payloadElements"] - before.get("payloadElements", 0))
        compressed.append(now["compressedCalls"] - before.get("compressedCalls", 0))
        before = now
        p = q = e = 0
        for index, n in sizes[step].items():
            v = state.view(index)
            if v["ncompressed"]:
                p, q, e = p + v["pElements"], q + v["qElements"], e + v["exactElements"]
            else:
                e += n
        factors.append([p, q, e])
    out = dict(outs={s: outs[s] for s in sorted(outs)}, losses=losses, payload=payload,
               compressed=compressed, factors=factors,
               alternate=state.communicator("cpu").config()["alternate"],
               finite=all(bool(torch.isfinite(p).all()) for p in model.parameters()))
    state.close()
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    if what == "train":
        steps, start = args
        result(alt=run(True, steps, start), plain=run(False, steps, start))
    dist.barrier()
    dist.destroy_process_group()
