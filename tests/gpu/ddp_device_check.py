#!/usr/bin/env python3
"""DDP checks of lowrank's hook on CUDA for the device check script (run_device_checks.sh, issue 26
item 7), launched by torchrun (or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set):

  --mode time     time per step of a ResNet-18-sized model (BasicBlocks, 11.7 M parameters, 64x64
                  inputs) under DDP with three reducers in turn, each on a fresh DDP model: exact
                  (DDP's allreduce), PyTorch's powerSGD_hook and lowrank's, rank 4, compression
                  from the first step after a 5-step warm-up. Prints one JSON line per reducer
                  on comm rank 0: {"reducer", "ms_per_step", "steps", "world"}; the rank-0 medians
                  over the timed steps. (PyTorch's hook is waited per bucket only over gloo, where
                  it needs it; over NCCL it runs as PyTorch ships it.)
  --mode syncbn   SyncBatchNorm and find_unused_parameters=True with lowrank's hook, a branch
                  unused on alternate steps, and each rank sleeping a random 0-20 ms per step
                  (jitter): the process group's collectives (SyncBatchNorm's, DDP's unused-
                  parameter allreduce) interleave with lowrank's on the device; the run must end
                  (the caller's timeout catches a deadlock) with parameters equal on every rank.
                  Prints "syncbn ok <steps> steps" on comm rank 0.

--cpu --backend gloo runs --mode time on the CPU (a rehearsal; --small for a small model).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


class Block(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = norm(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = norm(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNet18(nn.Module):
    """ResNet-18's layout (2 BasicBlocks per stage, 64-512 channels), 10 classes; `extra`: a
    branch used on even steps only (find_unused_parameters)."""

    def __init__(self, width=64, norm=nn.BatchNorm2d, extra=False):
        super().__init__()
        w = [width, 2 * width, 4 * width, 8 * width]
        self.stem = nn.Sequential(nn.Conv2d(3, w[0], 3, 1, 1, bias=False), norm(w[0]), nn.ReLU())
        layers, cin = [], w[0]
        for i, c in enumerate(w):
            layers += [Block(cin, c, 1 if i == 0 else 2, norm), Block(c, c, 1, norm)]
            cin = c
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(w[3], 10)
        self.extra = nn.Linear(w[3], 10) if extra else None

    def forward(self, x, use_extra=False):
        y = torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(self.stem(x)), 1), 1)
        out = self.head(y)
        return out + self.extra(y) if use_extra and self.extra is not None else out


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["time", "syncbn"], default="time")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--small", action="store_true", help="width 8 instead of 64 (rehearsals)")
    ap.add_argument("--reducers", default="exact,torch,lowrank")
    ap.add_argument("--distinct-hostid", action="store_true",
                    help="NCCL_HOSTID per process (several processes on one GPU)")
    return ap.parse_args()


def reducer_hook(name, group, device):
    """(state, hook) for DDP.register_comm_hook, or None for DDP's own allreduce."""
    if name == "exact":
        return None
    if name == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=group, matrix_approximation_rank=4,
                                 start_powerSGD_iter=2, min_compression_rate=2)
        if device.type == "cuda":
            return state, ps.powerSGD_hook

        def waited(st, bucket):  # gloo: several buckets abort unless each is waited
            fut = ps.powerSGD_hook(st, bucket)
            fut.wait()
            return fut
        return state, waited
    from lowrank.torch import PowerSGDState, powerSGD_hook
    return (PowerSGDState(process_group=group, matrix_approximation_rank=4,
                          start_powerSGD_iter=0, min_compression_rate=2), powerSGD_hook)


def time_reducers(args, device, rank, world):
    torch.manual_seed(0)
    width = 8 if args.small else 64
    x = torch.randn(args.batch, 3, 64, 64, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    for name in args.reducers.split(","):
        torch.manual_seed(1)
        model = ResNet18(width).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        hooked = reducer_hook(name, None, device)
        if hooked:
            ddp.register_comm_hook(*hooked)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        times = []
        for step in range(args.steps + 5):
            sync(device)
            t0 = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            sync(device)
            if step >= 5:
                times.append(time.perf_counter() - t0)
        if hooked and hasattr(hooked[0], "close"):
            hooked[0].close()
        if rank == 0:
            print(json.dumps({"reducer": name, "ms_per_step": 1e3 * statistics.median(times),
                              "steps": len(times), "world": world,
                              "params": sum(p.numel() for p in model.parameters())}), flush=True)


def syncbn(args, device, rank, world):
    torch.manual_seed(0)
    model = ResNet18(16, norm=nn.BatchNorm2d, extra=True)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    ddp = DDP(model, device_ids=[device.index], find_unused_parameters=True)
    from lowrank.torch import PowerSGDState, powerSGD_hook
    state = PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                          min_compression_rate=2, timeout=60)
    ddp.register_comm_hook(state, powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    jitter = random.Random(1000 + rank)
    gen = torch.Generator(device="cpu").manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(8, 3, 32, 32, generator=gen).to(device)
        y = torch.randint(0, 10, (8,), generator=gen).to(device)
        time.sleep(jitter.uniform(0, 0.02))
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x, use_extra=step % 2 == 0), y).backward()
        opt.step()
    sync(device)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    state.close()
    if rank == 0:
        print(f"syncbn {'ok' if same else 'FAILED: parameters differ across ranks'} "
              f"{args.steps} steps", flush=True)
    return 0 if same else 1


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    args = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.distinct_hostid:  # before any NCCL communicator, the process group's or lowrank's
        os.environ["NCCL_HOSTID"] = f"lowrank-ddp-check-host{rank}"
    if args.cpu:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    try:
        if args.mode == "syncbn":
            return syncbn(args, device, rank, world)
        time_reducers(args, device, rank, world)
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
