#!/usr/bin/env python3
"""Reducers compared inside one run (issue 27 item 2): one DDP run of the digits CNN over gloo,
one registered hook (studies/train/switch_hook.py) that switches between reducers in blocks of steps, in the
order of design.py for this run's --run-index. The run is the statistical unit: its
per-reducer time per batch (mean and median of the kept steps) is one observation of each
reducer, paired with the others by the run (studies/switch/analysis.py).

A run:
  1. Warm-up, untimed: each reducer in turn for --warmup-steps steps (DDP's bucket rebuild after
     the first step, both PowerSGD hooks' exact steps before compression: --warmup-steps must
     exceed --start-iter, so every measured step of a PowerSGD reducer is compressed).
  2. Measured blocks of --block-steps steps each; the first --drop-steps of every block are
     recorded but left out of the analysis (the switch's transient: caches, the first call of a
     reducer after another's).
  Between blocks, untimed: a barrier, the socket counters read, then rank 0's parameters and
  momentum broadcast, so every block starts from identical replicas (`local` lets them drift).

What switching does to training: each reducer's error feedback (PyTorch's and lowrank's PowerSGD
residuals, warm-start Q) carries over from its previous block to gradients many steps later, and
`local` steps train each replica on its own shard until the next broadcast. The loss goes on
falling, but the model is not the one any single reducer would train: this run measures time and
bytes, not accuracy (docs/training.md).

Recorded per step (every rank): the step's wall time (zero_grad, forward, backward with its
communication, opt.step, the loss read back), the hook's time inside its calls and the tail after
the last call (train.HookTimer), the process's CPU time and the scheduler's run delay summed over
its threads (studies/lib/procstat.py). Per block and rank: bytes on the sockets (sockbytes.py: this process's
TCP sockets; `ss -tin` of its network namespace with --ss; the interface's counters with --ifname),
lowrank's bytesSent, and each reducer's modelled bytes.

  PYTHONPATH=.:python /work/venv2/bin/python -m studies.switch.driver --spawn 2 --run-index 0 \
      --out /tmp/switch0.json
Defaults: plan.toml's [run] beside this file.
"""
import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from studies.lib import plan as planfile
from studies.lib import procstat, provenance, sockbytes
from studies.switch import design as switch_design
from studies.train import switch_hook, train

RUN = planfile.load(__file__)["run"]

_KEEP = []


def _steps(task):
    """Batches without end: epoch after epoch of the task's order."""
    epoch = 1
    while True:
        yield from task.batches(epoch)
        epoch += 1


def _sync_replicas(model, opt):
    """Rank 0's parameters and momentum on every rank (untimed, between blocks)."""
    with torch.no_grad():
        for p in model.module.parameters():
            dist.broadcast(p.data, 0)
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                dist.broadcast(buf, 0)


def _bytes_snapshot(args):
    return dict(process=sockbytes.process(), host_ss=sockbytes.host_ss() if args.ss else None,
                link=sockbytes.link(args.ifname) if args.ifname else None)


def _bytes_delta(a, b):
    return {k: sockbytes.diff(a[k], b[k]) for k in a}


def _lowrank_bytes(states):
    """bytesSent summed over the lowrank reducers' states (one is used per block, so a block's
    difference is that reducer's)."""
    return sum(st.stats()["bytesSent"] for st in states.values())


def _model_bytes(name, shapes, rank, world):
    """Modelled bytes one worker sends per measured step (train.model_bits_per_step, which knows
    these names; every measured PowerSGD step is compressed, the warm-up having run the exact
    ones)."""
    return train.model_bits_per_step(name, shapes, rank, world, True) / 8.0


def run(args):
    faulthandler.register(signal.SIGUSR1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    task = train.CnnTask(rank, world, args.batch, args.seed)
    module = task.model()
    shapes = [list(p.shape) for p in module.parameters() if p.requires_grad]
    ddp_kw = {} if args.bucket_cap_mb is None else dict(bucket_cap_mb=args.bucket_cap_mb)
    model = DDP(module, **ddp_kw)
    switch = switch_hook.Switch(args.reducers, args.rank, args.start_iter, args.seed)
    timer = train.HookTimer(switch.hook)
    model.register_comm_hook(None, timer.fn)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    order = switch_design.block_order(args.reducers, args.run_index, args.rounds)
    plan = [(name, args.warmup_steps, True) for name in args.reducers] + \
           [(name, args.block_steps, False) for name in order]
    total = sum(n for _, n, _ in plan)
    info = train.machine_info() if rank == 0 else None
    record = provenance.start() if rank == 0 else None  # this worker's own library
    if rank == 0:
        print(f"switch run {args.run_index}: {world} workers, order {' '.join(order)}, "
              f"{total} steps; torch {torch.__version__}", flush=True)
    batches, step, blocks = _steps(task), 0, []
    lowrank_states = switch.lowrank_states()
    t_run = time.perf_counter()
    for index, (name, nsteps, warmup) in enumerate(plan):
        switch.use(name)
        dist.barrier()
        b0 = _bytes_snapshot(args)
        lr0 = _lowrank_bytes(lowrank_states)
        rec = dict(index=index, reducer=name, warmup=warmup, steps=nsteps, batch_ms=[],
                   hook_ms=[], tail_ms=[], cpu_ms=[], run_delay_ms=[], loss=[])
        for _ in range(nsteps):
            b = next(batches)
            for g in opt.param_groups:
                g["lr"] = train.lr_at(step, total, args.lr)
            p0 = procstat.snapshot()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = task.loss(model, b)
            hook_before = timer.seconds
            t_backward = time.perf_counter()
            loss.backward()
            t_end = time.perf_counter()
            opt.step()
            lv = loss.item()
            rec["batch_ms"].append(round(1000.0 * (time.perf_counter() - t0), 4))
            for k, v in procstat.delta_ms(p0, procstat.snapshot()).items():
                rec[k].append(round(v, 4))
            rec["hook_ms"].append(round(1000.0 * (timer.seconds - hook_before), 4))
            rec["tail_ms"].append(round(1000.0 * (t_end - timer.last_return), 4)
                                  if timer.last_return > t_backward else None)
            rec["loss"].append(round(lv, 5))
            step += 1
        dist.barrier()  # every rank's sends of the block received, so sent
        rec["bytes"] = _bytes_delta(b0, _bytes_snapshot(args))
        if lowrank_states:
            rec["lowrank_bytes_sent"] = _lowrank_bytes(lowrank_states) - lr0
        rec["model_bytes_per_step"] = _model_bytes(name, shapes, args.rank, world)
        blocks.append(rec)
        _sync_replicas(model, opt)
    wall_s = time.perf_counter() - t_run

    everyone = [None] * world
    dist.all_gather_object(everyone, blocks)
    digest = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    digests = [torch.zeros_like(digest) for _ in range(world)]
    dist.all_gather(digests, digest)
    if rank == 0:
        config = dict(vars(args), world=world, order=order, parameters=int(sum(np.prod(s) for s in shapes)),
                      parameter_shapes=shapes, buckets={i: s for i, s in sorted(timer.shapes.items())},
                      torch_powersgd_wrapper="chained")
        for key in ("spawn", "fresh", "serve"):
            config.pop(key, None)
        info["loadavg_end"] = os.getloadavg()
        result = dict(kind="switch", config=config, machine=info,
                      provenance=provenance.finish(record), wall_s=wall_s,
                      replicas_identical=all(torch.equal(digests[0], d) for d in digests[1:]),
                      ranks=[dict(rank=r, blocks=bl) for r, bl in enumerate(everyone)])
        for name, st in lowrank_states.items():  # lowrank_stats, lowrank_ring_stats, ...
            key = name.replace("-", "_")
            result[key + "_stats"] = st.stats()
            result[key + "_transport"] = st.communicator("cpu").transport_info()
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(args.out + ".tmp", args.out)  # whole or absent: the study skips it
            print(f"wrote {args.out}", flush=True)
    switch.close()
    dist.destroy_process_group()
    _KEEP.append(locals())  # as train.run: no destructors before the caller's os._exit


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reducers", default=",".join(RUN["reducers"]),
                    help="comma-separated, from " + ", ".join(switch_hook.NAMES))
    ap.add_argument("--run-index", type=int, default=0, help="selects the Latin square's row")
    ap.add_argument("--setting", default="unlabelled",
                    help="the network setting's label, for the analysis (e.g. 100mbit, loopback)")
    ap.add_argument("--rounds", type=int, default=RUN["rounds"], help="row + mirror, this many times")
    ap.add_argument("--block-steps", type=int, default=RUN["block_steps"])
    ap.add_argument("--drop-steps", type=int, default=RUN["drop_steps"],
                    help="first steps of each block left out of the analysis (recorded)")
    ap.add_argument("--warmup-steps", type=int, default=RUN["warmup_steps"],
                    help="per reducer, untimed, first")
    ap.add_argument("--rank", type=int, default=RUN["rank"],
                    help="approximation rank of both PowerSGD hooks")
    ap.add_argument("--start-iter", type=int, default=RUN["start_iter"],
                    help="start_powerSGD_iter of both PowerSGD hooks (< --warmup-steps)")
    ap.add_argument("--seed", type=int, default=RUN["seed"])
    ap.add_argument("--batch", type=int, default=RUN["batch"])
    ap.add_argument("--lr", type=float, default=RUN["lr"])
    ap.add_argument("--bucket-cap-mb", type=float, help="DDP's bucket_cap_mb (default DDP's, 25)")
    ap.add_argument("--ss", action="store_true", help="also count `ss -tin`'s bytes (per host)")
    ap.add_argument("--ifname", help="also count this interface's bytes (/proc/net/dev)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--spawn", type=int, metavar="N", help="start N worker processes on this host")
    ap.add_argument("--fresh", action="store_true", help="with --spawn: new interpreters")
    ap.add_argument("--out", metavar="FILE.json")
    args = ap.parse_args(argv)
    args.reducers = args.reducers.split(",")
    bad = [r for r in args.reducers if r not in switch_hook.NAMES]
    if bad or len(set(args.reducers)) != len(args.reducers):
        ap.error(f"--reducers: unknown or repeated {bad or args.reducers}; known: "
                 + ", ".join(switch_hook.NAMES))
    if "local" not in args.reducers:
        ap.error("--reducers must include local: overheads are taken against it")
    if args.warmup_steps <= args.start_iter or args.start_iter <= 1:
        ap.error("need 1 < --start-iter < --warmup-steps (PyTorch's hook needs > 1; every "
                 "measured PowerSGD step compressed)")
    if not 0 <= args.drop_steps < args.block_steps:
        ap.error("need 0 <= --drop-steps < --block-steps")
    return args


def main():
    if sys.argv[1:] == ["--serve"]:
        return train.serve(parse, run)
    args = parse()
    if args.spawn:
        argv = sys.argv[1:]
        i = next(i for i, a in enumerate(argv) if a.startswith("--spawn"))
        del argv[i:i + (1 if "=" in argv[i] else 2)]
        sys.exit(train.spawn(args.spawn, argv, fresh=args.fresh, module="studies.switch.driver",
                             parse_fn=parse, run_fn=run))
    run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
