#!/usr/bin/env python3
"""Hybrid-sharded training (FSDP2 HSDP) on CPU over gloo: R replicas x S shards, the digits CNN or
the character transformer of train.py (same data, schedule, optimizer and defaults), with the
replica all-reduce done by
  native     FSDP2's own HSDP on a 2-D mesh (exact)
  exact      lowrank.torch.fsdp's hook at k = 0 (exact, by lowrank)
  lowrank    lowrank.torch.fsdp's hook at rank --rank, after --start-iter exact steps
One run per call; rank 0 prints per epoch and writes --out (JSON). Needs torch >= 2.7.
`hsdp.py --summary FOLDER` tabulates the JSON files of a folder.

    for s in 0 1 2; do for r in native lowrank; do
      /work/venv2/bin/python perf/train/hsdp.py --spawn 4 --model cnn --reducer $r --seed $s \\
          --out perf/results/hsdp/cnn_${r}_s$s.json; done; done
Bits per worker: what lowrank's communicator counted (bytesSent, over the replica group only;
the warm-up's exact steps included); for native, the ring all-reduce's 2(R-1)/R of the padded
shard per step, in float32 (a model, not a measurement). Timings here are not a benchmark.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import charlm  # noqa: E402
import train  # noqa: E402  (CnnTask, CharTask, lr_at, DEFAULTS; puts the checkout's python/ first)
import lowrank  # noqa: E402  (free_master_port; loads no library)


def spawn(n, argv):
    port = lowrank.free_master_port()
    procs = [subprocess.Popen([sys.executable, __file__] + argv,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(n)]
    return max(abs(p.wait()) for p in procs)


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
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def summary(folder):
    """A Markdown table of the runs' JSON files in `folder`: per model and reducer, the final
    metric (cnn: test accuracy; transformer: test loss) as mean +- standard error over seeds,
    and the bits per worker of the whole run (mean)."""
    import glob
    import statistics
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        c = d["config"]
        runs.setdefault((c["model"], c["reducer"]), []).append(d)
    print("| model | reducer | seeds | final metric (mean +- SE) | bits per worker (mean) |")
    print("|---|---|---|---|---|")
    for (model, reducer), ds in sorted(runs.items()):
        key = "test_accuracy" if model == "cnn" else "test_loss"
        xs = [d["epochs"][-1][key] for d in ds]
        se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
        bits = statistics.mean(d["epochs"][-1]["bits_per_worker"] for d in ds)
        print(f"| {model} | {reducer} | {len(xs)} | {key} {statistics.mean(xs):.4f} +- {se:.4f} "
              f"| {bits:.3g} |")


def main():
    if sys.argv[1:2] == ["--summary"]:
        return summary(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["cnn", "transformer"], default="cnn")
    ap.add_argument("--reducer", choices=["native", "exact", "lowrank"], default="lowrank")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--start-iter", type=int, default=10)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--windows", type=int, default=charlm.WINDOWS_PER_EPOCH * 2)
    ap.add_argument("--timeout", type=float, default=300)
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
        sys.exit(spawn(args.spawn, argv))
    run(args)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
