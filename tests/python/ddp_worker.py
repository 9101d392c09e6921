"""One rank of the multi-process PyTorch tests (tests/python/test_ddp.py starts them with
torchrun's variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Prints one line
"RESULT <json>" at the end; the test asserts on it.

    ddp_worker.py match K START UNUSED     DDP with lowrank's hook vs lowrankAllReduce driven
                                           directly on copies of the bucket inputs
    ddp_worker.py vs_torch K               PyTorch's hook vs lowrank's on real gradients, 8 seeds
    ddp_worker.py peer_death VICTIM        the victim rank SIGKILLs itself mid-step
    ddp_worker.py shapes                   synthetic buckets whose shapes differ across ranks
"""
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
import lowrank  # noqa: E402
from lowrank.torch import PowerSGDState, communicator_from_process_group, powerSGD_hook  # noqa: E402

from buckets import SyntheticBucket, compressible  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class Net(nn.Module):
    """Convolutions, linear layers, 1-D parameters (biases, a norm), a frozen parameter, and a
    branch used on even steps only (when `unused`)."""

    def __init__(self, unused):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.norm = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 256)   # 1 MiB of gradient: DDP's first bucket alone
        self.frozen = nn.Linear(256, 64)
        self.frozen.weight.requires_grad_(False)
        self.branch = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 10)
        self.unused = unused

    def forward(self, x, step):
        x = torch.relu(self.norm(self.conv1(x)))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        x = self.frozen(x)
        if not self.unused or step % 2 == 0:
            x = x + torch.tanh(self.branch(x))
        return self.fc2(x)


def match(k, start, unused, cuda=0, steps=8):
    torch.manual_seed(1234)  # the same initial model on every rank (DDP also broadcasts it)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = Net(unused).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02,
                                              find_unused_parameters=bool(unused))
    state = PowerSGDState(None, matrix_approximation_rank=k, start_powerSGD_iter=start,
                          random_seed=7, timeout=30)
    # The reference: a second communicator with the same settings (its warm-up too), driven
    # directly, each bucket's copy declared with ids numbered as the hook's doc says: in the
    # order DDP first hands the parameters to the hook.
    ref = communicator_from_process_group(None, dev.type, approx_rank=k, seed=7, timeout=30,
                                          min_compression_rate=2.0, start_iter=start)
    inputs, outputs, params, ids, numbers = {}, {}, {}, {}, {}

    def spy(st, bucket):
        i = bucket.index()
        inputs[i] = (bucket.buffer().data_ptr(), bucket.buffer().clone())
        params[i] = [tuple(p.shape) for p in bucket.parameters()]
        ids[i] = tuple(numbers.setdefault(p.data_ptr(), len(numbers)) for p in bucket.parameters())
        fut = powerSGD_hook(st, bucket)

        def keep(f):
            outputs[i] = f.value().clone()
            return f.value()
        return fut.then(keep)

    ddp.register_comm_hook(state, spy)
    # The warm-up is lowrank's exact allreduce, not the process group's: count the group's.
    group_allreduce, group_calls = dist.all_reduce, []
    dist.all_reduce = lambda *a, **kw: (group_calls.append(1), group_allreduce(*a, **kw))[1]
    warmup_diff = 0.0
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + RANK)
    ref_bufs, mismatches, compared, ptr_history, bucket_counts = {}, [], 0, [], []
    before = {}  # lowrank's counters when compression starts (the warm-up's exact calls)
    for step in range(steps):
        if step == start:
            before = state.stats()
        inputs.clear(), outputs.clear()
        x = torch.randn(16, 1, 8, 8, generator=gen).to(dev)
        y = torch.randint(0, 10, (16,), generator=gen).to(dev)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x, step), y).backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        bucket_counts.append(len(inputs))
        ptr_history.append(sorted(p for p, _ in inputs.values()))
        used = set()
        for i, (ptr, inp) in sorted(inputs.items()):
            # the warm-up too: lowrank's exact average, each id's first `start` calls
            key = (i, ptr, ids[i])
            if key not in ref_bufs:
                ref_bufs[key] = torch.empty_like(inp)
            used.add(key)
            expect = ref_bufs[key]
            ref.set_tensors(expect, list(zip(ids[i], params[i])))
            expect.copy_(inp)
            ref.allreduce(expect, op="avg")
            if cuda:
                torch.cuda.synchronize()
            compared += 1
            if step < start:  # exact: the average over the group, to rounding
                mean = inp / WORLD
                group_allreduce(mean)
                warmup_diff = max(warmup_diff, ((outputs[i] - mean).norm() / mean.norm()).item())
            if not torch.equal(outputs[i], expect):
                mismatches.append(f"step {step} bucket {i}: max diff "
                                  f"{(outputs[i] - expect).abs().max().item():.3g}")
        for key in [kk for kk in ref_bufs if kk not in used]:  # after their ids moved on
            ref.release(ref_bufs.pop(key))
    dist.all_reduce = group_allreduce
    st = state.stats()
    since = {k: st[k] - before.get(k, 0) for k in ("compressedElements", "exactElements",
                                                   "payloadElements")}
    live = sorted(inputs)
    views = {i: state.view(i) for i in live}
    want_compressed = [i for i in live if any(compressible(s, k) for s in params[i])]
    result(mismatches=mismatches, compared=compared, bucket_counts=bucket_counts,
           rebuilt=ptr_history[0] != ptr_history[-1], live=live, want_compressed=want_compressed,
           compressed=[i for i in live if views[i] and views[i]["ncompressed"] > 0],
           calls={i: views[i]["calls"] for i in live if views[i]}, buffers=st["buffers"],
           compressed_calls=st["compressedCalls"], calls_total=st["calls"],
           ratio=(since["compressedElements"] + since["exactElements"]) / since["payloadElements"],
           group_allreduces=len(group_calls), warmup_diff=warmup_diff,
           config_start_iter=state.communicator(dev.type).config()["start_iter"],
           exact_live=[i for i in live if i not in want_compressed])
    state.close()
    ref.destroy()


def load_safetensors(path):
    import numpy as np  # only here: a GPU machine's Python may lack numpy
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(meta["shape"])
    return out


def vs_torch(k, seeds=8, calls=10):
    """Both hooks on the same real gradients (perf/data/digits_cnn, one file per rank), one
    bucket, called directly: first-call relative error and cumulative error after `calls`."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as tph
    path = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "data", "digits_cnn",
                        f"step0040_worker{RANK % 4}.safetensors")
    grads = [torch.from_numpy(a.copy()) for a in load_safetensors(path).values()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    mean = flat.clone()
    dist.all_reduce(mean)
    mean /= WORLD
    shapes = [tuple(g.shape) for g in grads]
    res = {"torch": {"first": [], "cum": []}, "lowrank": {"first": [], "cum": []}}
    warmup = 2  # PyTorch's hook needs start_powerSGD_iter > 1 with error feedback
    for seed in range(seeds):
        for impl in ("torch", "lowrank"):
            if impl == "torch":
                st = tph.PowerSGDState(None, matrix_approximation_rank=k,
                                       start_powerSGD_iter=warmup, random_seed=seed)
                hook = tph.powerSGD_hook
            else:
                st = PowerSGDState(None, matrix_approximation_rank=k, start_powerSGD_iter=warmup,
                                   random_seed=seed)
                hook = powerSGD_hook
            buf = torch.empty_like(flat)
            total = torch.zeros_like(flat)
            for call in range(warmup + calls):
                buf.copy_(flat)
                out = hook(st, SyntheticBucket(0, buf, shapes)).wait()
                if call < warmup:
                    continue
                if call == warmup:
                    res[impl]["first"].append(((out - mean).norm() / mean.norm()).item())
                total += out
            res[impl]["cum"].append(((total - calls * mean).norm() / (calls * mean).norm()).item())
            if impl == "lowrank":
                st.close()
    result(**res)


def peer_death(victim):
    torch.manual_seed(0)
    model = Net(False)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    state = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=1, timeout=5)

    def spy(st, bucket):
        if RANK == victim and st.iter == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return powerSGD_hook(st, bucket)

    ddp.register_comm_hook(state, spy)
    t0 = None
    try:
        for step in range(50):
            t0 = time.monotonic()
            ddp(torch.randn(8, 1, 8, 8), step).sum().backward()
    except Exception as e:  # noqa: BLE001 - any failure is what we wait for
        result(raised=type(e).__name__, message=str(e)[:300], after=time.monotonic() - t0)
        sys.exit(0)  # a normal exit: lowrank's threads must not abort the interpreter's teardown
    result(raised=None)


def shapes():
    """Buckets with the same element count but other shapes on rank 0: every rank must raise."""
    state = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=0, timeout=20)
    shp = [(64, 32), (10,)] if RANK == 0 else [(32, 64), (10,)]
    buf = torch.randn(64 * 32 + 10)
    try:
        powerSGD_hook(state, SyntheticBucket(0, buf, shp)).wait()
        result(raised=None)
    except Exception as e:  # noqa: BLE001
        result(raised=type(e).__name__, message=str(e)[:400])
    state.close()


def from_env():
    """lowrank.Communicator.from_env (torchrun's variables; lowrank's root at MASTER_PORT + 1)
    and communicator_from_process_group give the same compressed result."""
    g = torch.Generator().manual_seed(RANK)
    x = torch.randn(96, 80, generator=g)
    outs = []
    for comm in (lowrank.Communicator.from_env(approx_rank=2, seed=9),
                 communicator_from_process_group(None, "cpu", approx_rank=2, seed=9)):
        buf = x.clone().reshape(-1)
        comm.set_layout(buf, [(96, 80)])
        comm.allreduce(buf)
        outs.append(buf)
        size, rank, compressed = comm.size, comm.rank, comm.stats()["compressedCalls"]
        comm.destroy()
    result(same=torch.equal(outs[0], outs[1]), size=size, rank=rank, compressed=compressed)


def not_initialized():
    """Before init_process_group: PowerSGDState must refuse with a clear error."""
    try:
        PowerSGDState(None, matrix_approximation_rank=2)
        return None
    except lowrank.LowrankError as e:
        return {"code": e.code, "message": str(e)}


def bad_use():
    """Each misuse raises a clear exception, and the hook works afterwards."""
    state = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=0)
    errors = {}
    cases = {
        "non_contiguous": lambda: SyntheticBucket(0, torch.randn(64, 32).t(), [(32, 64)]),
        "dtype": lambda: SyntheticBucket(0, torch.zeros(64, dtype=torch.complex64), [(64,)]),
        "mixed_device": lambda: _mixed_bucket(),
    }
    for name, make in cases.items():
        try:
            powerSGD_hook(state, make()).wait()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = {"type": type(e).__name__, "message": str(e)}
    buf = torch.randn(64 * 32)
    out = powerSGD_hook(state, SyntheticBucket(0, buf, [(64, 32)])).wait()
    errors["after"] = {"finite": bool(torch.isfinite(out).all()), "stats": state.stats()["compressedCalls"],
                       "start_iter": state.communicator().config()["start_iter"]}
    # one state for two models: the same bucket index twice in a step, with other buffers
    try:
        powerSGD_hook(state, SyntheticBucket(0, torch.randn(64 * 32), [(64, 32)], last=False))
        powerSGD_hook(state, SyntheticBucket(0, torch.randn(64 * 32), [(64, 32)], last=False))
        errors["two_models"] = None
    except lowrank.LowrankError as e:
        errors["two_models"] = str(e)
    state._workers["cpu"].drain()
    state.close()
    try:
        powerSGD_hook(state, SyntheticBucket(0, buf, [(64, 32)]))
        errors["closed"] = None
    except lowrank.LowrankError as e:
        errors["closed"] = str(e)
    errors["closed_stats"] = [state.stats(), state.compression_stats()]
    result(**errors)


def _mixed_bucket():
    b = SyntheticBucket(0, torch.randn(64), [(64,)])
    b._grads = [torch.empty(64, device="meta")]
    return b


if __name__ == "__main__":
    early = not_initialized() if sys.argv[1] == "bad_use" else None
    if os.environ.get("LOWRANK_TEST_CUDA") == "1":  # one GPU per rank, else all on device 0
        torch.cuda.set_device(RANK % torch.cuda.device_count())
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    if sys.argv[1] == "bad_use":
        print("NOTINIT " + json.dumps(early), flush=True)
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    {"match": match, "vs_torch": vs_torch, "peer_death": peer_death, "shapes": shapes,
     "bad_use": bad_use, "from_env": from_env}[what](*args)
    dist.barrier()
    dist.destroy_process_group()
