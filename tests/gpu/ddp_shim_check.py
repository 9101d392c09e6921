#!/usr/bin/env python3
"""PyTorch DDP job for the NCCL shim's device check (docs/nccl_shim.md).

A fixed synthetic regression task (a teacher MLP on inputs from a 32-dimensional subspace, plus
noise), learnt by a student MLP of width 1024 whose gradient buckets are all >= 1 MiB, for 200
steps with fixed seeds. Comm rank 0 prints one parseable line at the end:

    final_loss <value>         mean squared error on a fixed held-out set

Run it without and with the shim and compare the two losses (they should agree within 10%):

    torchrun --nproc_per_node=1 tests/gpu/ddp_shim_check.py
    LD_PRELOAD=<build>/plugin/nccl_shim/liblowrank_nccl.so LOWRANK_DEBUG=INFO \\
        torchrun --nproc_per_node=1 tests/gpu/ddp_shim_check.py

With the shim and LOWRANK_DEBUG=INFO, each process prints the shim's report line at the end
("LOWRANK INFO NCCL shim: comm ... destroyed: N calls compressed, ..."); N > 0 shows the bucket
allreduces were compressed.

Two processes on one GPU: NCCL refuses two comm ranks on one device of one host, so each process
can pretend to be its own host (a distinct NCCL_HOSTID, set before NCCL starts):

    torchrun --nproc_per_node=2 tests/gpu/ddp_shim_check.py --distinct-hostid

Other options: --steps, --layout-hint on|off|auto (auto: when the shim is loaded, a DDP comm hook
gives each bucket's tensor shapes to lowrankNcclSetBucketLayout, so the shim compresses per
tensor; off: the shim sees flat buckets, batched mode), --backend gloo --cpu and --powersgd-hook
(PyTorch's own powerSGD_hook, rank 4) for a CPU-only rehearsal without NCCL.
"""
import argparse
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN, LATENT, OUT = 1024, 32, 64


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256, help="samples per comm rank per step")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--layout-hint", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--distinct-hostid", action="store_true",
                    help="set NCCL_HOSTID per process (several processes on one GPU)")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--powersgd-hook", action="store_true",
                    help="rehearsal without the shim: PyTorch's powerSGD_hook (rank 4)")
    return ap.parse_args()


def mlp(width):
    return nn.Sequential(nn.Linear(IN, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                         nn.Linear(width, width), nn.GELU(), nn.Linear(width, OUT))


class Task:
    """y = teacher(x) + noise, x = z B with z ~ N(0, I_32): the same task on every comm rank."""

    def __init__(self, device):
        g = torch.Generator().manual_seed(1234)
        self.basis = (torch.randn(LATENT, IN, generator=g) / LATENT ** 0.5).to(device)
        self.teacher = mlp(256)
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        with torch.no_grad():
            for p in self.teacher.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[-1] ** 0.5))
        self.teacher.to(device)
        self.device = device

    def batch(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(n, LATENT, generator=g).to(self.device)
        noise = 0.05 * torch.randn(n, OUT, generator=g).to(self.device)
        x = z @ self.basis
        with torch.no_grad():
            y = self.teacher(x) + noise
        return x, y


def shim_symbol():
    """lowrankNcclSetBucketLayout when the shim is in the process, else None."""
    try:
        f = ctypes.CDLL(None).lowrankNcclSetBucketLayout
    except (AttributeError, OSError):
        return None
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                  ctypes.POINTER(ctypes.c_int64)]
    f.restype = ctypes.c_int
    return f


def layout_hook(set_layout):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        shapes = [tuple(p.shape) for p in bucket.parameters()]  # the bucket's order
        ndims = (ctypes.c_int * len(shapes))(*[len(s) for s in shapes])
        flat = [d for s in shapes for d in s]
        dims = (ctypes.c_int64 * len(flat))(*flat)
        r = set_layout(ctypes.c_void_p(bucket.buffer().data_ptr()), len(shapes), ndims, dims)
        if r != 0:
            raise RuntimeError(f"lowrankNcclSetBucketLayout returned {r}")
        return default_hooks.allreduce_hook(state, bucket)

    return hook


def main():
    a = parse()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.distinct_hostid:
        os.environ["NCCL_HOSTID"] = f"lowrank-ddp-check-{rank}"  # read by NCCL at its first init
    if a.cpu or not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, rank=rank, world_size=world)

    torch.manual_seed(0)
    model = mlp(a.width).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    set_layout = shim_symbol()
    hint = a.layout_hint == "on" or (a.layout_hint == "auto" and set_layout is not None)
    if a.powersgd_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                   start_powerSGD_iter=3, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif hint:
        if set_layout is None:
            sys.exit("--layout-hint on: lowrankNcclSetBucketLayout not found (is the shim loaded?)")
        ddp.register_comm_hook(None, layout_hook(set_layout))

    task = Task(device)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    xe, ye = task.batch(4096, seed=999_999)  # held out, the same everywhere
    t0 = time.time()
    for step in range(a.steps):
        x, y = task.batch(a.batch, seed=10_000 * (step + 1) + rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 50 == 0 or step == a.steps - 1):
            print(f"step {step} train_loss {loss.item():.6f}", flush=True)
    with torch.no_grad():
        final = nn.functional.mse_loss(model(xe), ye).item()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if rank == 0:
        print(f"world {world} device {device} shim {'yes' if set_layout else 'no'} layout_hint "
              f"{'yes' if hint else 'no'} steps {a.steps} seconds {time.time() - t0:.1f}", flush=True)
        print(f"final_loss {final:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
