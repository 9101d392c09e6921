#!/usr/bin/env python3
"""Data-parallel training on CPU with a choice of gradient reducer: DDP over gloo, one process per
worker, one thread each. Models and data: the digits CNN (studies/train/digits.py) and a small
character-level transformer on CPython sources (studies/train/charlm.py). What it measures and how:
docs/training.md.

Reducers (--reducer):
  allreduce       DDP's own exact allreduce (no hook)
  lowrank-exact   lowrank's hook with matrix_approximation_rank=0: every step an exact allreduce by
                  lowrank (start_powerSGD_iter=0, so every step goes through lowrank)
  fp16            PyTorch's fp16_compress_hook
  torch-powersgd  PyTorch's powerSGD_hook at rank --rank, each bucket's call chained on the previous
                  bucket's future (unwrapped it aborts over gloo with more than one bucket; the
                  fair baseline: see torch_baseline.py)
  torch-powersgd-waited  the same hook, each bucket waited before the hook returns (all its work
                  on the autograd thread, no overlap: the old baseline, a labelled second row)
  lowrank         lowrank's powerSGD_hook at rank --rank
  local           no reduction: the bucket comes back as it is (compute-only floor, timing only;
                  the workers' models drift apart, so its accuracy means nothing)

Launch one process per worker with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
or let --spawn N start N local workers (Debian's torchrun fails on Python 3.11):
  PYTHONPATH=.:python /opt/venv-t2/bin/python -m studies.train.train --spawn 16 --model cnn \
      --reducer lowrank --rank 2 --seed 0 --out /tmp/cnn_lowrank_r2_s0.json
(from the checkout's root: `.` for the studies package, python/ for lowrank when not installed)
Rank 0 prints one line per epoch and writes --out (JSON: config, machine, per-epoch metrics).
Options of issue 28's study (studies/rank/run.py): --optimizer sgd|adamw (another optimizer
needs its own --lr), --start-frac F (compression from round(F x steps)), and for lowrank
--exclude NAMES|embeddings-head (allreduced exactly) and --adaptive LOW:HIGH (an AdaptiveRank,
window one epoch unless --adaptive-window; the JSON's rank_trace holds each change of the ks).
--alternate (issue 44, with --reducer lowrank): alternating PowerSGD, PowerSGDState(alternate=True);
the JSON's config.alternate says so and studies/lib/runlabel.py labels such a run lowrank-alternate.
--factor-dtype bf16|fp16 (issue 45, with --reducer lowrank): the factors in 16 bits on the wire,
PowerSGDState(factor_dtype=...); labelled lowrank-bf16 (lowrank-alternate-bf16 with --alternate).
lowrank's JSON also holds bits_after_warmup: its bytesSent from the first compressed step on.
--evals-per-epoch E (issue 42's time to accuracy, studies/tta): the test set evaluated after each
1/E of an epoch's steps; the JSON's `evals` lists every evaluation point (epoch, step, train_s: the
training time so far with every evaluation left out, test_loss, test_accuracy for the CNN, eval_s),
the epoch's last one also in `epochs` as before.
"""
import argparse
import datetime
import faulthandler
import functools
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from studies.lib import launch, provenance, runlabel
from studies.lib.launch import ROOT as REPO
from studies.lib.ports import free_master_port
from studies.train import charlm, digits, torch_baseline

REDUCERS = ["allreduce", "lowrank-exact", "fp16", "torch-powersgd", "torch-powersgd-waited",
            "lowrank", "local"]
TORCH_POWERSGD = ("torch-powersgd", "torch-powersgd-waited")
# Per model: epochs, per-worker batch, learning rate; chosen with allreduce (full precision) and
# used for every reducer. Schedule for both: linear warm-up over the first 10% of the steps, then
# cosine decay to 0 at the end of the last epoch. Optimizer: SGD momentum 0.9 (CNN), AdamW without
# weight decay (transformer).
DEFAULTS = {"cnn": dict(epochs=10, batch=8, lr=0.05),
            "transformer": dict(epochs=8, batch=4, lr=5e-3)}


# ---- launcher ------------------------------------------------------------------------------------
def _worker_env(rank, n, port):
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _preload():
    """Imports the workers need, done once before forking: torch 2.x's DDP imports torch._dynamo on
    construction, and 16 workers importing torch and dynamo at once on 2 cores take ~40 s."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: F401
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:
        pass


def spawn(n, argv, fresh=False, module="studies.train.train", parse_fn=None, run_fn=None):
    """Starts n workers with torchrun's variables on a free local port: forked from this process
    after the imports (default), or with fresh=True new interpreters running `python -m module`
    (as torchrun would). If one exits with an error, the others are terminated. Returns the worst exit
    status. parse_fn, run_fn: another driver's (studies/switch/driver.py), default this one's."""
    parse_fn, run_fn = parse_fn or parse, run_fn or run
    port = free_master_port()
    if fresh:
        procs = [subprocess.Popen(launch.module(sys.executable, module, *argv),
                                  env=launch.env(**_worker_env(r, n, port)))
                 for r in range(n)]
        poll, stop = (lambda p: p.poll()), (lambda p: p.terminate())
    else:
        _preload()
        args = parse_fn(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        procs = []
        for r in range(n):
            pid = os.fork()
            if pid == 0:
                _child(args, _worker_env(r, n, port), run_fn=run_fn)
            procs.append(pid)

        def poll(pid):
            done, status = os.waitpid(pid, os.WNOHANG)
            return None if done == 0 else os.waitstatus_to_exitcode(status)

        def stop(pid):
            os.kill(pid, signal.SIGTERM)
    worst = 0
    try:
        while procs:
            for p in list(procs):
                rc = poll(p)
                if rc is None:
                    continue
                procs.remove(p)
                worst = max(worst, abs(rc))
                if rc != 0:
                    for q in procs:
                        stop(q)
            time.sleep(0.05)
    finally:  # interrupted: the workers go too
        for q in procs:
            stop(q)
    return worst


def _child(args, env, log=None, run_fn=None):
    """In a forked worker: set the launcher's variables, run (run_fn, default run), then leave by
    os._exit, without the interpreter's slow teardown. log: a file for the worker's stdout and
    stderr."""
    code = 1
    try:
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        os.environ.update(env)
        (run_fn or run)(args)
        code = 0
    except SystemExit as e:  # a message (SystemExit("...")) is printed, as the interpreter would
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(parse_fn=None, run_fn=None):
    """--serve: one worker's runs, one after another, each forked from this process after the
    imports (starting a fresh interpreter with torch 2.x costs ~30 s of 2 cores with 4 at once).
    Reads one JSON object per line on stdin, {"argv": [...], "env": {...}, "log": path or null},
    and answers each with {"rc": exit status} on stdout once that run has ended. For drivers that
    start one server per host (studies/lib/hosts.py). parse_fn, run_fn: as spawn()'s."""
    _preload()
    for line in sys.stdin:
        job = json.loads(line)
        args = (parse_fn or parse)(job["argv"])
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(args, job.get("env", {}), job.get("log") or os.devnull, run_fn=run_fn)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


# ---- hooks ---------------------------------------------------------------------------------------
def _local_hook(_state, bucket):
    """No reduction: each worker keeps its own gradient (timing floor only)."""
    return torch_baseline.completed(bucket.buffer())


class HookTimer:
    """Wall time spent inside the hook's call (on DDP's autograd thread, during backward): for
    torch-powersgd-waited that is the whole reduction; for lowrank the set-up and hand-off to its
    worker thread; for fp16 the cast and the launch. Also the time the last call returned, from
    which run() takes the tail: backward's end minus the last bucket's hand-off, the reduction
    left to wait for once every gradient is computed (DDP waits for each bucket's future before
    backward returns). Records each bucket's gradient shapes."""

    def __init__(self, hook):
        self.seconds = 0.0
        self.last_return = 0.0  # perf_counter() when the latest hook call returned
        self.shapes = {}

        @functools.wraps(hook)  # DDP reads the hook's __name__ and __qualname__
        def timed(state, bucket):
            t = time.perf_counter()
            try:
                return hook(state, bucket)
            finally:
                self.last_return = time.perf_counter()
                self.seconds += self.last_return - t
                i = bucket.index()
                if i not in self.shapes or len(self.shapes[i]) != len(bucket.gradients()):
                    self.shapes[i] = [list(g.shape) for g in bucket.gradients()]
        self.fn = timed


# ---- bits per step (message-size model) ----------------------------------------------------------
def powersgd_split(shapes, k, min_compression_rate=2.0):
    """PyTorch's per-tensor rule: each gradient viewed as (shape[0], -1) = (n, m); with
    k' = min(k, n, m) it is compressed if (n + m) k' rate < n m, sending P (n x k') and Q (m x k');
    else sent exactly (1-D tensors never pass: (n + 1) * 1 * 2 >= n). Returns
    (P + Q elements, exact elements, compressed tensors, all elements)."""
    pq = exact = ncomp = total = 0
    for s in shapes:
        numel = int(np.prod(s)) if len(s) else 1
        total += numel
        n = s[0] if len(s) else 1
        m = numel // n if n else 0
        kk = min(k, n, m)
        if len(s) >= 1 and (n + m) * kk * min_compression_rate < n * m:
            pq += (n + m) * kk
            ncomp += 1
        else:
            exact += numel
    return pq, exact, ncomp, total


def ring_factor(world):
    """Elements a worker sends per element reduced, by a ring allreduce: 2 (N - 1) / N."""
    return 2.0 * (world - 1) / world


def model_bits_per_step(reducer, shapes, k, world, compressed_step):
    """Bits one worker sends in one step, by the message-size model (documented in
    docs/training.md): 32 or 16 bits per element times the ring's 2 (N - 1) / N. The same for every
    reducer, for comparisons between them. lowrank's bits are not modelled here: its host transport
    chooses an algorithm per call by its cost model, and the driver reads what that algorithm sent
    from lowrank's bytesSent counter (equal to the model's bytes for the chosen algorithm, to the
    byte: tests/transport/algorithms_test.cc)."""
    r = ring_factor(world)
    grad = sum(int(np.prod(s)) for s in shapes)
    if reducer == "local":
        return 0.0
    if reducer == "fp16":
        return 16.0 * grad * r
    lowrank = reducer.startswith("lowrank") and reducer != "lowrank-exact"
    if (reducer in TORCH_POWERSGD or lowrank) and compressed_step:
        pq, exact, _, _ = powersgd_split(shapes, k)
        # studies/train/switch_hook.py's variants: -alternate sends P or Q, half of P + Q over an
        # even number of steps; -bf16/-fp16 send the factors in 16 bits (the exact part in 32).
        pq_bits = 16.0 if reducer.endswith(("-bf16", "-fp16")) else 32.0
        pq_share = 0.5 if "-alternate" in reducer else 1.0
        return (pq_bits * pq_share * pq + 32.0 * exact) * r
    return 32.0 * grad * r


# ---- models and data -----------------------------------------------------------------------------
class CnnTask:
    name = "cnn"

    def __init__(self, rank, world, batch, seed):
        images, labels = digits.load_digits()
        xtr, ytr, xte, yte = digits.train_test_split(images, labels)
        xs, ys = digits.shard(xtr, ytr, rank, world)
        self.xs, self.ys = torch.from_numpy(xs), torch.from_numpy(ys)
        # Test set sharded the same way: every rank evaluates its part, the sums are allreduced.
        self.xte, self.yte = torch.from_numpy(xte[rank::world]), torch.from_numpy(yte[rank::world])
        # The same step count on every rank: the smallest shard's full batches.
        self.steps = (len(ytr) // world) // batch
        self.batch, self.seed, self.rank = batch, seed, rank
        self.data = dict(train_images=len(ytr), test_images=len(yte),
                         images_per_worker_per_epoch=self.steps * batch)

    def model(self):
        return digits.DigitsCNN()

    def batches(self, epoch):
        order = torch.from_numpy(np.random.default_rng((self.seed, epoch, self.rank))
                                 .permutation(len(self.ys)))
        for i in range(self.steps):
            idx = order[i * self.batch:(i + 1) * self.batch]
            yield self.xs[idx], self.ys[idx]

    @staticmethod
    def loss(model, b):
        return F.cross_entropy(model(b[0]), b[1])

    def evaluate(self, module):
        """(summed loss, correct, count) over this rank's part of the test set."""
        loss, acc = digits.evaluate(module, self.xte, self.yte)
        n = len(self.yte)
        return loss * n, round(acc * n), n


class CharTask:
    name = "transformer"

    def __init__(self, rank, world, batch, seed, windows):
        train, test = charlm.load_corpus()
        self.train = train
        self.test = charlm.test_windows(test)[rank::world]
        self.per_worker = windows // world
        self.steps = self.per_worker // batch
        self.batch, self.seed, self.rank = batch, seed, rank
        self.data = dict(train_chars=len(train), test_chars=len(test), windows_per_epoch=windows,
                         windows_per_worker_per_epoch=self.steps * batch,
                         context=charlm.CONTEXT)

    def model(self):
        return charlm.CharTransformer()

    def batches(self, epoch):
        ws = charlm.sample_windows(self.train, self.steps * self.batch, self.seed, epoch, self.rank)
        for i in range(self.steps):
            yield ws[i * self.batch:(i + 1) * self.batch]

    @staticmethod
    def loss(model, b):
        return charlm.loss_of(model, b)

    def evaluate(self, module):
        total, n = charlm.evaluate(module, self.test)
        return total, 0, n


# ---- the run -------------------------------------------------------------------------------------
def lr_at(step, total, lr):
    """Linear warm-up over the first 10% of the steps, then cosine decay to 0 at step `total`."""
    warm = max(1, round(0.1 * total))
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def eval_ends(steps, per_epoch):
    """The steps into an epoch after which run() evaluates: round(steps j / per_epoch) for
    j = 1..per_epoch, the last the epoch's end. ValueError unless 1 <= per_epoch <= steps."""
    if not 1 <= per_epoch <= steps:
        raise ValueError(f"--evals-per-epoch {per_epoch}: between 1 and the epoch's {steps} steps")
    return [round(steps * j / per_epoch) for j in range(1, per_epoch + 1)]


def evaluate_all(model, task, extra=()):
    """Rank 0's model on the whole test set: rank 0's buffers (BatchNorm statistics) on every rank,
    each rank its part of the test set, the sums allreduced with `extra` (floats summed beside
    them). Returns the allreduced float64 tensor [summed loss, correct, count, *extra]. A
    collective: every rank calls it at the same point."""
    for buf in model.module.buffers():
        dist.broadcast(buf, 0)
    loss_t, correct, n = task.evaluate(model.module)
    agg = torch.tensor([loss_t, correct, n, *extra], dtype=torch.float64)
    dist.all_reduce(agg)
    return agg


def machine_info():
    info = dict(hostname=socket.gethostname(), platform=platform.platform(),
                python=platform.python_version(), executable=sys.executable,
                torch=torch.__version__, numpy=np.__version__, cpu_count=os.cpu_count(),
                cpus_allowed=len(os.sched_getaffinity(0)), torch_threads=torch.get_num_threads(),
                blas=next((w.split("=", 1)[1].split(",")[0] for w in torch.__config__.show().split()
                           if w.startswith("BLAS_INFO=")), None),
                loadavg_start=os.getloadavg(),
                # what changes lowrank's, UCX's and gloo's choices (LOWRANK_UCX_BETA_NS, ...)
                env={k: v for k, v in sorted(os.environ.items())
                     if k.startswith(("LOWRANK_", "UCX_", "GLOO_", "NCCL_", "OMP_"))})
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    info["git"] = provenance.describe(REPO)
    return info


_KEEP = []


def run(args):
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: a stuck worker's Python stacks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    if args.model == "cnn":
        task = CnnTask(rank, world, args.batch, args.seed)
    else:
        task = CharTask(rank, world, args.batch, args.seed, args.windows)
    if task.steps < 1:
        raise SystemExit(f"--batch {args.batch} leaves no full batch per worker per epoch")
    module = task.model()
    shapes = [list(p.shape) for p in module.parameters() if p.requires_grad]
    ddp_kw = {} if args.bucket_cap_mb is None else dict(bucket_cap_mb=args.bucket_cap_mb)
    model = DDP(module, **ddp_kw)

    # Step s (0-based) is compressed by either PowerSGD hook iff s >= start_iter.
    total_steps = task.steps * args.epochs
    start_iter = args.start_iter if args.start_frac is None else round(args.start_frac * total_steps)
    if args.reducer in TORCH_POWERSGD and start_iter <= 1:
        raise SystemExit(f"{args.reducer}: compression from step {start_iter}; PyTorch's hook "
                         "needs start_powerSGD_iter > 1")
    if args.reducer in TORCH_POWERSGD + ("lowrank",) and start_iter >= total_steps:
        raise SystemExit(f"{args.reducer}: compression from step {start_iter} of {total_steps}: no "
                         "step would be compressed (--start-iter or --start-frac)")
    start_iter = 0 if args.reducer == "lowrank-exact" else start_iter
    state, timer, lowrank_state = None, None, None
    if args.reducer in ("lowrank", "lowrank-exact"):
        from lowrank.torch import PowerSGDState, powerSGD_hook
        k = 0 if args.reducer == "lowrank-exact" else args.rank
        extra = {}
        if args.exclude:
            extra.update(exclude=[n for n in args.exclude.split(",") if n], model=module)
        if args.rank_of:
            extra.update(rank_of=dict(args.rank_of), model=module)
        if args.alternate:
            extra.update(alternate=True)  # ACP-SGD: one factor allreduce per step, P then Q
        if args.factor_dtype != "fp32":
            extra.update(factor_dtype=args.factor_dtype)  # issue 45: factors in 16 bits on the wire
        if args.adaptive:
            from lowrank.torch.adaptive import AdaptiveRank
            extra.update(adaptive=AdaptiveRank(args.adaptive[0], args.adaptive[1],
                                               window=args.adaptive_window if args.adaptive_window
                                               is not None else task.steps,
                                               error_max=args.adaptive_error_max),
                         model=module)
        state = lowrank_state = PowerSGDState(process_group=None, matrix_approximation_rank=k,
                                              start_powerSGD_iter=start_iter, random_seed=args.seed,
                                              **extra)
        timer = HookTimer(powerSGD_hook)
    elif args.reducer in TORCH_POWERSGD:
        state, hook = torch_baseline.make("waited" if args.reducer.endswith("waited") else "chained",
                                          None, args.rank, start_iter, args.seed)
        timer = HookTimer(hook)
    elif args.reducer == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        timer = HookTimer(default_hooks.fp16_compress_hook)
    elif args.reducer == "local":
        timer = HookTimer(_local_hook)
    if timer is not None:
        model.register_comm_hook(state, timer.fn)

    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pq, exact, ncomp, grad = powersgd_split(shapes, args.rank)
    config = dict(vars(args), world=world, start_iter_effective=start_iter,
                  steps_per_epoch=task.steps, total_steps=total_steps, data=task.data,
                  parameters=grad, parameter_tensors=len(shapes), parameter_shapes=shapes,
                  powersgd_rule=dict(rank=args.rank, pq_elements=pq, exact_elements=exact,
                                     compressed_tensors=ncomp, ratio=grad / max(1, pq + exact)),
                  ring_factor=ring_factor(world))
    if args.reducer in TORCH_POWERSGD:  # runs without this field were waited (runlabel.py)
        config["torch_powersgd_wrapper"] = "waited" if args.reducer.endswith("waited") else "chained"
    for key in ("spawn", "fresh"):
        config.pop(key, None)
    info = machine_info() if rank == 0 else None
    record = provenance.start(REPO) if rank == 0 else None  # this worker's own library

    if rank == 0:
        print(f"{args.model} {args.reducer}" + (" alternating" if args.alternate else "")
              + (f" rank {args.rank}" if "powersgd" in args.reducer or args.reducer == "lowrank" else "")
              + f": {world} workers, {task.steps} steps of {args.batch} per epoch, "
              f"{grad} parameters; torch {torch.__version__}", flush=True)
    epochs, step, bits_total, prev_sent = [], 0, 0.0, 0
    bits_name = runlabel.reducer(config)  # lowrank's variants (alternate, factor dtype) by name
    # The evaluation points (--evals-per-epoch): after these steps of each epoch; `evals` holds one
    # record per point, its train_s the run's training time so far with every evaluation left out.
    try:
        ends = eval_ends(task.steps, args.evals_per_epoch)
    except ValueError as e:
        raise SystemExit(str(e))
    evals, train_before = [], 0.0  # train_before: the finished epochs' train_s summed

    def eval_point(epoch, in_epoch, train_s, agg, eval_s):
        rec = dict(epoch=epoch, step=step, epoch_steps=in_epoch, train_s=train_before + train_s,
                   test_loss=agg[0].item() / agg[2].item(), eval_s=eval_s)
        if args.model == "cnn":
            rec["test_accuracy"] = agg[1].item() / agg[2].item()
        evals.append(rec)
        return rec

    sent_before_compression = None  # lowrank's bytesSent when step start_iter begins
    rank_trace = []  # adaptive: [step, {name: k}] after each step whose ks differ from the last
    signal_trace = []  # adaptive: [measured step, {name: [gradient norm, compression error]}]
    t_run = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t_epoch = t_segment = time.perf_counter()
        train_s, in_epoch = 0.0, 0  # the epoch's training time so far, evaluations left out
        model.train()
        batch_ms, hook_ms, tail_ms, loss_sum = [], [], [], 0.0
        hook_s0 = timer.seconds if timer else 0.0
        bits_model = 0.0
        for b in task.batches(epoch):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total_steps, args.lr)
            if step == start_iter and lowrank_state is not None:
                sent_before_compression = lowrank_state.stats()["bytesSent"]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = task.loss(model, b)
            hook_before = timer.seconds if timer else 0.0
            t_backward = time.perf_counter()
            loss.backward()
            t_end = time.perf_counter()
            if timer:
                hook_ms.append(1000.0 * (timer.seconds - hook_before))
                tail_ms.append(1000.0 * (t_end - timer.last_return)
                               if timer.last_return > t_backward else None)
            opt.step()
            lv = loss.item()
            batch_ms.append(1000.0 * (time.perf_counter() - t0))
            loss_sum += lv
            compressed = step >= start_iter
            bits_model += model_bits_per_step(bits_name, shapes, args.rank, world, compressed)
            if args.adaptive:  # tensor_ranks waits for the step's work: only in adaptive runs
                ks = lowrank_state.tensor_ranks()
                if not rank_trace or rank_trace[-1][1] != ks:
                    rank_trace.append([step, ks])
                measured, signals = lowrank_state.adaptive_signals()
                if measured is not None and (not signal_trace or signal_trace[-1][0] != measured):
                    signal_trace.append([measured, {n: list(v) for n, v in signals.items()}])
            step += 1
            in_epoch += 1
            if in_epoch in ends[:-1]:  # a point inside the epoch: its clock stops for the evaluation
                train_s += time.perf_counter() - t_segment
                t_eval = time.perf_counter()
                agg = evaluate_all(model, task)
                rec = eval_point(epoch, in_epoch, train_s, agg, time.perf_counter() - t_eval)
                if rank == 0:
                    print(f"  step {step} (epoch {epoch}, {in_epoch}/{task.steps}): "
                          + (f"test accuracy {rec['test_accuracy']:.4f}" if args.model == "cnn"
                             else f"test loss {rec['test_loss']:.4f}"), flush=True)
                t_segment = time.perf_counter()
        train_s += time.perf_counter() - t_segment

        # Measured bits: lowrank's own counter, the warm-up steps included (lowrank's hook does
        # them as its own exact allreduces).
        st = lowrank_state.stats() if lowrank_state is not None else None
        if st is not None:
            sent = st["bytesSent"] - prev_sent
            prev_sent = st["bytesSent"]
            bits = 8.0 * sent
            bits_source = "lowrank bytesSent"
        else:
            bits, bits_source = bits_model, "model"
        bits_total += bits

        # The epoch's last evaluation point, the train loss and time per batch beside it.
        t_eval = time.perf_counter()
        agg = evaluate_all(model, task, (loss_sum / task.steps, float(np.mean(batch_ms))))
        eval_point(epoch, in_epoch, train_s, agg, time.perf_counter() - t_eval)
        train_before += train_s
        rec = dict(epoch=epoch, steps=task.steps, train_loss=agg[3].item() / world,
                   test_loss=agg[0].item() / agg[2].item(),
                   batch_ms_mean=float(np.mean(batch_ms)), batch_ms_mean_all_ranks=agg[4].item() / world,
                   batch_ms=[round(x, 3) for x in batch_ms],
                   hook_ms=[round(x, 3) for x in hook_ms] if timer else None,
                   tail_ms=[None if x is None else round(x, 3) for x in tail_ms] if timer else None,
                   hook_call_ms_mean=(1000.0 * (timer.seconds - hook_s0) / task.steps) if timer else None,
                   bits=bits, bits_cumulative=bits_total, bits_source=bits_source,
                   bits_model=bits_model, lr_end=opt.param_groups[0]["lr"],
                   train_s=train_s, epoch_s=time.perf_counter() - t_epoch)
        if args.model == "cnn":
            rec["test_accuracy"] = agg[1].item() / agg[2].item()
        if st is not None:
            rec["lowrank_stats"] = st
        epochs.append(rec)
        if rank == 0:
            metric = (f"test accuracy {rec['test_accuracy']:.4f}" if args.model == "cnn"
                      else f"test loss {rec['test_loss']:.4f}")
            print(f"epoch {epoch}: train loss {rec['train_loss']:.4f}, {metric}, "
                  f"{rec['batch_ms_mean']:.1f} ms/batch, {bits / 8e6:.3f} MB sent per worker"
                  + (f", ratio {st['ratio']:.1f}" if st else "") + f" ({rec['epoch_s']:.1f} s)",
                  flush=True)

    result = dict(config=config, machine=info, epochs=epochs, evals=evals,
                  wall_s=time.perf_counter() - t_run)
    if lowrank_state is not None:
        result["lowrank_stats"] = lowrank_state.stats()
        if sent_before_compression is not None:  # the bits of the compressed steps alone
            result["bits_after_warmup"] = 8.0 * (result["lowrank_stats"]["bytesSent"]
                                                 - sent_before_compression)
        if args.adaptive:
            result["rank_trace"] = rank_trace
            result["signal_trace"] = signal_trace
        result["buckets"] = []
        for i in sorted(timer.shapes):
            bshapes = timer.shapes[i]
            result["buckets"].append(dict(index=i, shapes=bshapes,
                                          compressible=powersgd_split(bshapes, args.rank)[2]
                                          if args.reducer == "lowrank" else 0,
                                          view=lowrank_state.view(i)))
        lowrank_state.close()
    elif args.reducer in TORCH_POWERSGD:
        rate, before, after = state.compression_stats()
        result["torch_powersgd_stats"] = dict(compress_rate=rate, numel_before=before,
                                              numel_after=after)
    if rank == 0:
        result["machine"]["loadavg_end"] = os.getloadavg()
        result["provenance"] = provenance.finish(record)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, args.out)  # a finished run's file is whole: the study skips it
            print(f"wrote {args.out}", flush=True)
    dist.destroy_process_group()
    # The caller leaves by os._exit. Freeing DDP's objects before that can block: seen on rank 0
    # with 16 forked workers under torch 2.11, a destructor waiting on a gloo thread. Kept alive.
    _KEEP.append(locals())


EMBEDDINGS_HEAD = ["tok.weight", "pos.weight", "head.weight"]  # the transformer's (charlm.py)


def _embeddings_head(ap, option, model):
    """The names 'embeddings-head' stands for in `option` (EMBEDDINGS_HEAD), or ap.error
    off the transformer."""
    if model != "transformer":
        ap.error(f"{option} embeddings-head: the transformer's (tok, pos, head)")
    return list(EMBEDDINGS_HEAD)


def _parse_rank_of(ap, text, model):
    """--rank-of's NAME=K list as [[name, k]] (embeddings-head expanded), or ap.error."""
    out = []
    for item in (x for x in text.split(",") if x):
        name, eq, k = item.partition("=")
        try:
            k = int(k)
        except ValueError:
            k = -1
        if not eq or not name or not 0 <= k <= 65536:
            ap.error(f"--rank-of {item!r}: NAME=K with K an integer in [0, 65536]")
        if name == "embeddings-head":
            out += [[n, k] for n in _embeddings_head(ap, "--rank-of", model)]
        else:
            out.append([name, k])
    if len({n for n, _ in out}) != len(out):
        ap.error(f"--rank-of {text!r}: a parameter named twice")
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reducer", choices=REDUCERS, default="allreduce")
    ap.add_argument("--rank", type=int, default=4, help="approximation rank k of the PowerSGD reducers")
    ap.add_argument("--model", choices=["cnn", "transformer"], default="cnn")
    ap.add_argument("--epochs", type=int, help="default: cnn 10, transformer 8")
    ap.add_argument("--seed", type=int, default=0, help="data order, initial weights, PowerSGD's Q")
    ap.add_argument("--batch", type=int, help="samples per worker per step (default: cnn 8 images, "
                                              "transformer 4 windows)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default: cnn 0.05, transformer 5e-3)")
    ap.add_argument("--start-iter", type=int,
                    help="start_powerSGD_iter of both PowerSGD hooks: exact steps before compression "
                         "(PyTorch's hook requires > 1; default 10)")
    ap.add_argument("--start-frac", type=float,
                    help="instead of --start-iter: compression from this fraction of the run's steps "
                         "(round(F * total steps); PyTorch's advice is about 0.1)")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"],
                    help="default: cnn sgd (momentum 0.9), transformer adamw (no weight decay)")
    ap.add_argument("--exclude", default="",
                    help="lowrank: comma-separated parameter names allreduced exactly (PowerSGDState's "
                         "exclude); 'embeddings-head' names the transformer's tok, pos and head weights")
    ap.add_argument("--rank-of", default="",
                    help="lowrank: comma-separated NAME=K, a parameter's own approximation rank "
                         "(PowerSGDState's rank_of; 0: exact); NAME 'embeddings-head' names the "
                         "transformer's tok, pos and head weights")
    ap.add_argument("--adaptive", metavar="LOW:HIGH",
                    help="lowrank: an AdaptiveRank between ranks LOW and HIGH (lowrank.torch.adaptive)")
    ap.add_argument("--adaptive-window", type=int,
                    help="steps between the adaptive rule's measurements (default: one epoch's steps, "
                         "Accordion's once per epoch)")
    ap.add_argument("--adaptive-error-max", default="none",
                    help="the adaptive rule's error_max: a compression error at or above it keeps the "
                         "high rank; 'none' turns that test off (default none, the rule's; issue 28's "
                         "first study ran with 0.9)")
    ap.add_argument("--alternate", action="store_true",
                    help="lowrank: alternating PowerSGD (PowerSGDState's alternate=True, ACP-SGD): "
                         "P at one compressed step, Q at the next; recorded as config.alternate")
    ap.add_argument("--factor-dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="lowrank: the factors' type on the wire (PowerSGDState's factor_dtype, issue "
                         "45); recorded as config.factor_dtype")
    ap.add_argument("--windows", type=int, default=charlm.WINDOWS_PER_EPOCH * 2,
                    help="transformer: windows per epoch, all workers together (default 2048)")
    ap.add_argument("--evals-per-epoch", type=int, default=1, metavar="E",
                    help="test evaluations per epoch, after each 1/E of its steps (default 1: at its "
                         "end); the JSON's `evals` holds each with the training time so far, "
                         "evaluations excluded")
    ap.add_argument("--bucket-cap-mb", type=float, help="DDP's bucket_cap_mb (default DDP's, 25)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the process group's waits")
    ap.add_argument("--spawn", type=int, metavar="N", help="start N worker processes on this host")
    ap.add_argument("--fresh", action="store_true",
                    help="with --spawn: start the workers as new interpreters instead of forking")
    ap.add_argument("--out", metavar="FILE.json", help="rank 0 writes the results here")
    ap.add_argument("--serve", action="store_true", help="alone: run jobs read on stdin (see serve())")
    args = ap.parse_args(argv)
    own_optimizer = "sgd" if args.model == "cnn" else "adamw"
    if args.optimizer not in (None, own_optimizer) and args.lr is None:
        ap.error(f"--optimizer {args.optimizer} on the {args.model}: give its own --lr (the default "
                 f"{DEFAULTS[args.model]['lr']} is {own_optimizer}'s)")
    args.optimizer = args.optimizer or own_optimizer
    for key, val in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.evals_per_epoch < 1:
        ap.error(f"--evals-per-epoch {args.evals_per_epoch}: at least 1")
    if args.start_frac is not None and not 0.0 <= args.start_frac < 1.0:
        ap.error(f"--start-frac {args.start_frac}: a fraction in [0, 1)")
    if args.start_frac is not None and args.start_iter is not None:
        ap.error("--start-iter and --start-frac: give one")
    if args.start_iter is None:
        args.start_iter = 10
    if (args.exclude or args.adaptive or args.rank_of or args.alternate
            or args.factor_dtype != "fp32") and args.reducer != "lowrank":
        ap.error("--exclude, --rank-of, --adaptive, --alternate and --factor-dtype are options of "
                 "--reducer lowrank")
    names = [n for n in args.exclude.split(",") if n]
    if "embeddings-head" in names:
        i = names.index("embeddings-head")
        names[i:i + 1] = _embeddings_head(ap, "--exclude", args.model)
    args.exclude = ",".join(names)
    args.rank_of = _parse_rank_of(ap, args.rank_of, args.model)
    both = sorted(set(names) & {n for n, _ in args.rank_of})
    if both:
        ap.error(f"--exclude and --rank-of both name {', '.join(both)}: give each parameter one")
    if args.rank_of and args.rank == 0:
        ap.error("--rank 0 turns compression off for every parameter: --rank-of needs a rank > 0")
    if args.adaptive:
        try:
            lo, hi = (int(x) for x in args.adaptive.split(":"))
        except ValueError:
            ap.error(f"--adaptive {args.adaptive!r}: LOW:HIGH, two integers")
        args.adaptive = [lo, hi]
        if not lo <= args.rank <= hi:
            ap.error(f"--rank {args.rank} with --adaptive {lo}:{hi}: give a rank in LOW..HIGH (the "
                     "study gives LOW); bits_model counts every step at --rank, the measured bits "
                     "count what was sent")
    try:
        args.adaptive_error_max = (None if args.adaptive_error_max == "none"
                                   else float(args.adaptive_error_max))
    except ValueError:
        ap.error(f"--adaptive-error-max {args.adaptive_error_max!r}: a number or 'none'")
    if args.adaptive_window is not None and args.adaptive_window < 1:
        ap.error(f"--adaptive-window {args.adaptive_window}: steps, at least 1")
    if args.reducer in TORCH_POWERSGD and args.start_frac is None and args.start_iter <= 1:
        ap.error(f"--start-iter must be > 1 for {args.reducer} (PyTorch's hook requires it with error "
                 "feedback and warm start); use the same value for lowrank to compare")
    return args


def main():
    if sys.argv[1:] == ["--serve"]:
        return serve()
    args = parse()
    if args.spawn:
        argv = sys.argv[1:]
        i = next(i for i, a in enumerate(argv) if a.startswith("--spawn"))
        del argv[i:i + (1 if "=" in argv[i] else 2)]
        sys.exit(spawn(args.spawn, argv, fresh=args.fresh))
    run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch 2.x's interpreter teardown takes seconds per process


if __name__ == "__main__":
    main()
