"""One rank of tests/studies/test_torch_baseline.py: the digits CNN under DDP over gloo, reduced by
PyTorch's powerSGD_hook wrapped as studies/train/torch_baseline.py wraps it (--kind chained or
waited; unwrapped, by hand, shows the abort), for a few steps with small buckets; writes this rank's
parameters, the bucket count and the sizes of the hook's allreduces in the order this rank issued
them to OUT/rank<r>.pt. Started with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from studies.train import torch_baseline, train


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["chained", "waited", "unwrapped"], required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--start-iter", type=int, default=2)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.25)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    task = train.CnnTask(rank, world, batch=16, seed=0)
    model = DDP(task.model(), bucket_cap_mb=args.bucket_cap_mb)
    issued = []  # numel of each dist.all_reduce, in issue order (the hook's U, P and Q)
    all_reduce = dist.all_reduce

    def logged(tensor, *a, **kw):
        issued.append(tensor.numel())
        return all_reduce(tensor, *a, **kw)
    dist.all_reduce = logged  # powerSGD_hook calls dist.all_reduce at call time
    state, hook = torch_baseline.make(args.kind, None, 4, args.start_iter, 0)
    if args.kind == "unwrapped":  # by hand only: shows the abort torch_baseline.py explains
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook as hook
    buckets = set()

    def counting(st, bucket):
        buckets.add(bucket.index())
        return hook(st, bucket)
    model.register_comm_hook(state, counting)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    while step < args.steps:
        for b in task.batches(step):  # a fresh order each pass, as train.py's epochs
            if step == args.steps:
                break
            opt.zero_grad()
            task.loss(model, b).backward()
            opt.step()
            step += 1
    torch.save(dict(params=[p.detach().clone() for p in model.module.parameters()],
                    buckets=len(buckets), compressed=state.compression_stats()[0], issued=issued,
                    iters=state.iter),
               os.path.join(args.out, f"rank{rank}.pt"))
    dist.barrier()
    # Leave without tearing down: torch 1.13 aborted now and then at exit ("Resource deadlock
    # avoided": a gloo thread holding the last reference to the group joins itself), as train.py
    # leaves by os._exit for the same reason.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
