#!/usr/bin/env python3
"""Hybrid-sharded training (FSDP2 HSDP) on CPU over gloo: R replicas x S shards, the digits CNN or
the character transformer of train.py (same data, schedule, optimizer and defaults), with the
replica all-reduce done by
  native     FSDP2's own HSDP on a 2-D mesh (exact)
  exact      lowrank.torch.fsdp's hook at k = 0 (exact, by lowrank)
  lowrank    lowrank.torch.fsdp's hook at rank --rank, after --start-iter exact steps
One run per call; rank 0 prints per epoch and writes --out (JSON). Needs torch >= 2.7. The
study's runs: studies/hsdp/run.py (the plan: plan.toml); its table: studies/hsdp/report.py.

    PYTHONPATH=.:python /work/venv2/bin/python -m studies.hsdp.driver --spawn 4 --model cnn \\
        --reducer lowrank --seed 0 --out /tmp/cnn_lowrank_s0.json
Bits per worker: what lowrank's communicator counted (bytesSent, over the replica group only;
the warm-up's exact steps included); for native, the ring all-reduce's 2(R-1)/R of the padded
shard per step, in float32 (a model, not a measurement). Timings here are not a benchmark.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from studies.lib import plan as planfile
from studies.lib import provenance
from studies.train import charlm, train  # CnnTask, CharTask, lr_at, DEFAULTS; spawn

PLAN = planfile.load(__file__)


def shard_model(module, mesh, model_name):
    """fully_shard the big layers, then the root (an FSDP group each)."""
    from torch.distributed.fsdp import fully_shard
    layers = ([module.c3, module.c4, module.f1] if model_name == "cnn"
              else list(module.blocks) + [module.head])
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def run(args):
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas = world // args.shards
    mesh = init_device_mesh("cpu", (replicas, args.shards), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(args.seed)
    if args.model == "cnn":
        task = train.CnnTask(rank, world, args.batch, args.seed)
        _, _, xte, yte = train.digits.train_test_split(*train.digits.load_digits())
        task.xte, task.yte = torch.from_numpy(xte), torch.from_numpy(yte)  # all of it, every rank
    else:
        task = train.CharTask(rank, world, args.batch, args.seed, args.windows)
        task.test = charlm.test_windows(charlm.load_corpus()[1])  # all of it, every rank
    module = task.model()
    state = None
    if args.reducer == "native":
        model = shard_model(module, mesh, args.model)
    else:
        import lowrank.torch.fsdp as lf
        model = shard_model(module, mesh["shard"], args.model)
        k = 0 if args.reducer == "exact" else args.rank
        state = lf.PowerSGDState(mesh["replicate"].get_group(), matrix_approximation_rank=k,
                                 start_powerSGD_iter=0 if k == 0 else args.start_iter,
                                 random_seed=args.seed, timeout=args.timeout)
        lf.register(model, state)
    shard_elems = sum(p.to_local().numel() for p in model.parameters() if p.requires_grad)
    if args.model == "cnn":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    record = provenance.start() if rank == 0 else None  # this worker's own library
    total, step, epochs, t_run = task.steps * args.epochs, 0, [], time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        loss_sum = 0.0
        for b in task.batches(epoch):
            for g in opt.param_groups:
                g["lr"] = train.lr_at(step, total, args.lr)
            opt.zero_grad()
            loss = task.loss(model, b)
            loss.backward()
            opt.step()
            loss_sum, step = loss_sum + loss.item(), step + 1
        for buf in model.buffers():  # BatchNorm statistics: rank 0's everywhere
            dist.broadcast(buf, 0)
        # every rank the whole test set: FSDP's forward is collective
        loss_t, correct, n = task.evaluate(model)
        rec = dict(epoch=epoch, train_loss=loss_sum / task.steps, test_loss=loss_t / n)
        if args.model == "cnn":
            rec["test_accuracy"] = correct / n
        if state is not None:
            rec["bits_per_worker"] = 8.0 * state.stats()["bytesSent"]
        else:  # ring over the replicas, float32, the padded shard (<= shard_elems + padding)
            rec["bits_per_worker"] = 8.0 * 4 * shard_elems * 2 * (replicas - 1) / replicas * step
        epochs.append(rec)
        if rank == 0:
            print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4g}" for k, v in rec.items()
                                                 if k != "epoch"), flush=True)
    out = dict(config=vars(args), world=world, replicas=replicas, torch=torch.__version__,
               machine=train.machine_info(),  # its "git": the revision, "-dirty" if uncommitted
               epochs=epochs, wall_s=time.perf_counter() - t_run,
               lowrank_stats=state.stats() if state is not None else None)
    if state is not None:
        state.close()
    if rank == 0 and args.out:
        out["provenance"] = provenance.finish(record)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["cnn", "transformer"], default="cnn")
    ap.add_argument("--reducer", choices=["native", "exact", "lowrank"], default="lowrank")
    ap.add_argument("--rank", type=int, default=PLAN["rank"])
    ap.add_argument("--start-iter", type=int, default=PLAN["start_iter"])
    ap.add_argument("--shards", type=int, default=PLAN["shards"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--windows", type=int, default=charlm.WINDOWS_PER_EPOCH * 2)
    ap.add_argument("--timeout", type=float, default=PLAN["timeout_s"])
    ap.add_argument("--spawn", type=int, metavar="N")
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args()
    for key, val in train.DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.spawn:
        argv = sys.argv[1:]
        i = next(i for i, a in enumerate(argv) if a.startswith("--spawn"))
        del argv[i:i + (1 if "=" in argv[i] else 2)]
        sys.exit(train.spawn(args.spawn, argv, fresh=True, module="studies.hsdp.driver"))
    run(args)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
