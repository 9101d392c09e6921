#!/usr/bin/env python3
"""Data-parallel training on CPU with lowrank's PowerSGD hook: DDP over gloo, the digits CNN of
perf/data/README.md on scikit-learn's digits images (perf/data/digits).

Launch one process per worker, with torchrun:
    torchrun --nproc_per_node 4 examples/ddp_cpu.py
or by hand with torchrun's variables (Debian's torchrun fails on Python 3.11), which --spawn does:
    python3 examples/ddp_cpu.py --spawn 4     # MASTER_PORT from the environment, else 29500
Prints per epoch the training loss, the test accuracy and lowrank's counters.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import launch  # beside this script: lowrank's import, the digits data, --spawn

digits = launch.digits()
import lowrank  # noqa: E402
from lowrank.torch import PowerSGDState, powerSGD_hook  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_spawn_arg(ap)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--rank", type=int, default=4, help="approximation rank k (0: no compression)")
    ap.add_argument("--start-iter", type=int, default=10, help="exact steps before compression")
    ap.add_argument("--batch", type=int, default=32, help="images per worker per step")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    launch.spawn_or_check(ap, args, __file__)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    images, labels = digits.load_digits()
    xtr, ytr, xte, yte = digits.train_test_split(images, labels)
    xs, ys = digits.shard(xtr, ytr, rank, world)
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    if len(xs) < args.batch:
        ap.error(f"--batch {args.batch} is more than this worker's {len(xs)} training images")

    model = DDP(digits.DigitsCNN())
    # The two lines of PyTorch's PowerSGD, with the import from lowrank.torch:
    state = PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                          start_powerSGD_iter=args.start_iter)
    model.register_comm_hook(state, powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    if rank == 0:
        print(f"lowrank {lowrank.__version__} from {os.path.dirname(lowrank.__file__)}", flush=True)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        total, steps, t0 = 0.0, 0, time.perf_counter()
        for i in range(0, len(xs) - args.batch + 1, args.batch):  # the same step count on every rank
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        elapsed = time.perf_counter() - t0
        test_loss, acc = digits.evaluate(model.module, xte, yte)
        st = state.stats()
        if rank == 0:
            print(f"epoch {epoch}: loss {total / steps:.4f}, test accuracy {acc:.4f}, "
                  f"{1000 * elapsed / steps:.1f} ms/step; lowrank: {st['compressedCalls']} compressed "
                  f"calls of {st['calls']}, ratio {st['ratio']:.1f}", flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
