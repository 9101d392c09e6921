#!/usr/bin/env python3
"""Hybrid-sharded training (HSDP) on CPU with FSDP2 and lowrank's PowerSGD on the replica
all-reduce: 2 replicas x 2 shards over gloo, the digits CNN of studies/train/digits.py on
scikit-learn's digits images (perf/data/digits). Needs torch >= 2.7 (FSDP2's all-reduce hook).

Parameters are sharded over a 1-D "shard" mesh (FSDP reduce-scatters over it and all-reduces
nothing); lowrank's hook averages each reduce-scattered shard over the "replicate" group, PowerSGD
compressed. Every rank is a data-parallel worker with its own part of the data.

    python3 examples/fsdp_hsdp_cpu.py --spawn 4   # 4 processes here; MASTER_PORT from the environment,
                                                  # else 29500
    torchrun --nproc_per_node 4 examples/fsdp_hsdp_cpu.py
Prints per epoch the training loss, the test accuracy and lowrank's counters.
"""
import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import launch  # beside this script: lowrank's import, the digits data, --spawn

digits = launch.digits()
import lowrank  # noqa: E402
import lowrank.torch.fsdp as lowrank_fsdp  # noqa: E402  (ImportError on torch without FSDP2)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_spawn_arg(ap)
    ap.add_argument("--shards", type=int, default=2, help="ranks per replica (the shard group)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rank", type=int, default=4, help="approximation rank k (0: no compression)")
    ap.add_argument("--start-iter", type=int, default=10, help="exact steps before compression")
    ap.add_argument("--batch", type=int, default=32, help="images per worker per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=60, help="seconds a wait for a peer may last")
    args = ap.parse_args()
    launch.spawn_or_check(ap, args, __file__)

    torch.set_num_threads(1)
    # gloo's default timeout is 30 minutes: a dead peer would hold the others that long in
    # FSDP's reduce-scatter. lowrank's hook raises within its own timeout; match them.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.shards:
        ap.error(f"{world} processes do not split into replicas of {args.shards} shards")
    mesh = init_device_mesh("cpu", (world // args.shards, args.shards),
                            mesh_dim_names=("replicate", "shard"))

    torch.manual_seed(0)  # the same initial model on every rank
    model = digits.DigitsCNN()
    for layer in (model.c3, model.c4, model.f1):  # an FSDP group each, the rest in the root's
        fully_shard(layer, mesh=mesh["shard"])   # the 1-D shard mesh: no native all-reduce
    fully_shard(model, mesh=mesh["shard"])
    state = lowrank_fsdp.PowerSGDState(mesh["replicate"].get_group(),
                                       matrix_approximation_rank=args.rank,
                                       start_powerSGD_iter=args.start_iter, timeout=args.timeout)
    lowrank_fsdp.register(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    images, labels = digits.load_digits()
    xtr, ytr, xte, yte = digits.train_test_split(images, labels)
    xs, ys = digits.shard(xtr, ytr, rank, world)  # every rank its own data
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    if rank == 0:
        print(f"lowrank {lowrank.__version__}, torch {torch.__version__}: {world // args.shards} "
              f"replicas x {args.shards} shards", flush=True)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        total, steps, t0 = 0.0, 0, time.perf_counter()
        # the same step count on every rank (FSDP's collectives need it)
        n = min(len(xs), len(xtr) // world)
        for i in range(0, n - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        elapsed = time.perf_counter() - t0
        _, acc = digits.evaluate(model, xte, yte)  # every rank: FSDP all-gathers in forward
        st = state.stats()
        if rank == 0:
            print(f"epoch {epoch}: loss {total / steps:.4f}, test accuracy {acc:.4f}, "
                  f"{1000 * elapsed / steps:.1f} ms/step; lowrank: {st['compressedCalls']} "
                  f"compressed calls of {st['calls']}, ratio {st['ratio']:.1f}", flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
