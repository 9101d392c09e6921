"""One rank of the checkpoint tests (tests/python/test_checkpoint.py starts them with torchrun's
variables). DDP over gloo with lowrank's hook, SGD with momentum, the same data per step and rank
in every run. Prints one line "RESULT <json>" at the end; parameters go to files in DIR.

    ckpt_worker.py full DIR STEPS          STEPS steps uninterrupted: DIR/full_rank{r}.pt
    ckpt_worker.py first DIR STEPS         STEPS steps, then the checkpoint: DIR/ckpt_rank{r}.pt
                                           (model, optimizer, hook state_dict) and
                                           DIR/state_rank{r}.pt (torch.save of the PowerSGDState)
    ckpt_worker.py resume DIR FROM TO HOW  new processes: the checkpoint loaded, steps FROM..TO-1:
                                           DIR/resume_{HOW}_rank{r}.pt. HOW: state_dict, pickle,
                                           or none (the hook's iter set, its buckets not loaded)
    ckpt_worker.py one_rank DIR FROM WHEN  a restore on comm rank 0 only (rank 1 loads the
                                           counters, no buckets). WHEN "restart": at the first
                                           step after loading; "live": two steps later (after
                                           DDP's rebuild), each rank reloading its own state
Variables: CKPT_START (start_powerSGD_iter, default 1), CKPT_CAP (DDP's bucket_cap_mb, default
0.02), CKPT_ALTERNATE=1 (the hook's alternate=True: alternating PowerSGD), CKPT_SWITCH=N (full:
every bucket switched to the other schedule before step N, Communicator.set_alternate), CKPT_TAG
(appended to the names of the files resume writes), CKPT_MODEL=small (fc layers of 8 and 16, head
of 16 classes: the model of tests/python/fixtures, whose version-1 checkpoints the hook before
tensor ids wrote with this worker; README.md there).
full and resume also write DIR/canon_{name}_rank{r}.bin: every parameter's lowrank state at the
end (format 2, in id order, whatever the buckets).
"""
import datetime
import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
from lowrank.torch import PowerSGDState, powerSGD_hook  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# approximation rank; compression from step START (1: step 0 is lowrank's exact average;
# CKPT_START sets another, for a checkpoint taken when compression starts)
K, START = 2, int(os.environ.get("CKPT_START", "1"))
CAP, TAG = float(os.environ.get("CKPT_CAP", "0.02")), os.environ.get("CKPT_TAG", "")
ALTERNATE = os.environ.get("CKPT_ALTERNATE") == "1"
# CKPT_MODEL=small: the model of the version-1 fixtures (tests/python/fixtures), a few kB of state
SMALL = os.environ.get("CKPT_MODEL") == "small"
IN, HID, OUT = (8, 16, 16) if SMALL else (32, 64, 4096)


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class Net(nn.Module):
    """Rebuilt by DDP after its first step into three buckets (bucket_cap_mb 0.02; the head alone
    fills DDP's 1 MiB first bucket): [head], [norm, fc3, fc2], [fc1]. Before that, DDP's first
    step has one bucket of every parameter, in the model's order: a restarted run's first step
    meets the checkpoint's three buckets inside it. fc2 and fc3 have the same shapes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN, HID)
        self.fc2 = nn.Linear(HID, HID)
        self.fc3 = nn.Linear(HID, HID)
        self.norm = nn.LayerNorm(HID)
        self.head = nn.Linear(HID, OUT)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        return self.head(self.norm(x))


class Logged(logging.Handler):
    """The messages of the logger "lowrank.torch"."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []
        log = logging.getLogger("lowrank.torch")
        log.setLevel(logging.INFO)
        log.addHandler(self)

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def make(seed=1234):
    torch.manual_seed(seed)
    if SMALL:  # several buckets of a few kB: torch 1.13's first is 1 MiB whatever the cap
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(CAP * 2**20)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=CAP)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, opt


def new_state():
    return PowerSGDState(None, matrix_approximation_rank=K, start_powerSGD_iter=START,
                         random_seed=7, timeout=30, alternate=ALTERNATE)


def counters(state):
    """What the tests read of lowrank's counters and configuration."""
    st = state.stats()
    return dict(compressed=st["compressedCalls"], payload=st["payloadElements"],
                alternate=state.communicator("cpu").config()["alternate"])


def spy(buckets):
    """The hook, recording each step's buckets (their parameter counts)."""
    def hook(state, bucket):
        buckets.setdefault(state.iter, []).append(len(bucket.gradients()))
        return powerSGD_hook(state, bucket)
    return hook


def train(ddp, opt, steps):
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x = torch.randn(16, IN, generator=g)
        y = torch.randint(0, OUT, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def path(d, name, ext="pt"):
    return os.path.join(d, f"{name}_rank{RANK}.{ext}")


def canonical(state, d, name):
    """Every parameter's lowrank state (format 2) in id order, whatever the buckets: a scratch
    buffer declared with every id saves each one's state where it is held."""
    sd = state.state_dict()
    pairs = sorted({i: s for b in sd["buckets"] for i, s in zip(b["params"], b["shapes"])}.items())
    comm, scratch = state.communicator("cpu"), torch.empty(1)
    comm.set_tensors(scratch, pairs)
    with open(path(d, f"canon_{name}", "bin"), "wb") as f:
        f.write(comm.save_state(scratch))
    comm.release(scratch)


def full(d, steps):
    model, ddp, opt = make()
    state, buckets = new_state(), {}
    ddp.register_comm_hook(state, spy(buckets))
    switch, switched = int(os.environ.get("CKPT_SWITCH", steps)), []
    train(ddp, opt, range(switch))
    if switch < steps:  # every bucket's buffer to the other schedule from step `switch` on
        state.stats()   # (waits for the queued work)
        for b in state._buckets.values():  # the last step's buckets (the hook's own record)
            comm = state.communicator(b.device)
            comm.set_alternate(b.ptr, not ALTERNATE)
            switched.append(int(not ALTERNATE))
    train(ddp, opt, range(switch, steps))
    torch.save(params(model), path(d, "full"))
    canonical(state, d, "full")
    result(buckets=buckets, switched=switched, **counters(state))
    state.close()


def first(d, steps):
    model, ddp, opt = make()
    state, buckets = new_state(), {}
    ddp.register_comm_hook(state, spy(buckets))
    train(ddp, opt, range(steps))
    sd = state.state_dict()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "powersgd": sd},
               path(d, "ckpt"))
    torch.save(state, path(d, "state"))  # pickles the PowerSGDState
    result(buckets=buckets, iter=sd["iter"], saved=[b["params"] for b in sd["buckets"]],
           bytes=[len(b["state"] or b"") for b in sd["buckets"]], rank=sd["rank"],
           version=sd["version"], devices=[b.get("device") for b in sd["buckets"]],
           **counters(state))
    state.close()


def _load_ckpt(d, rank=None):
    p = os.path.join(d, f"ckpt_rank{RANK if rank is None else rank}.pt")
    return torch.load(p)  # torch >= 2.6: weights_only=True by default, which must take it


def resume(d, start, stop, how):
    log = Logged()
    model, ddp, opt = make(seed=999)  # another initial model: the checkpoint must replace it
    ckpt = _load_ckpt(d)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    errors = {}
    if how == "state_dict":
        # a state of other settings refuses the checkpoint, naming what differs
        other = PowerSGDState(None, matrix_approximation_rank=K + 1, start_powerSGD_iter=START,
                              random_seed=7, timeout=30)
        try:
            other.load_state_dict(ckpt["powersgd"])
        except ValueError as e:
            errors["other_k"] = str(e)
        other.close()
        state = new_state()
        try:  # another rank's file
            state.load_state_dict(_load_ckpt(d, (RANK + 1) % WORLD)["powersgd"])
        except ValueError as e:
            errors["other_rank"] = str(e)
        state.load_state_dict(ckpt["powersgd"])
        errors["roundtrip"] = state.state_dict()["buckets"] == ckpt["powersgd"]["buckets"]
    elif how == "pickle":
        state = torch.load(path(d, "state"), weights_only=False)
        errors["process_group"] = repr(state.process_group)
    else:
        state = new_state()
        state.iter = ckpt["powersgd"]["iter"]
    buckets = {}
    ddp.register_comm_hook(state, spy(buckets))
    train(ddp, opt, range(start, stop))
    torch.save(params(model), path(d, f"resume_{how}{TAG}"))
    canonical(state, d, f"resume_{how}{TAG}")
    result(buckets=buckets, iter=state.iter, log=log.lines, **counters(state), **errors)
    state.close()


def one_rank(d, start, when):
    model, ddp, opt = make(seed=999)
    ckpt = _load_ckpt(d)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    sd = ckpt["powersgd"]
    state = new_state()
    if when == "restart" and RANK != 0:
        sd = dict(sd, buckets=[])  # the counters only
    state.load_state_dict(sd)
    ddp.register_comm_hook(state, powerSGD_hook)
    step = start
    if when == "live":  # both ranks restored; two steps (DDP's rebuild in between)
        train(ddp, opt, range(start, start + 2))
        step = start + 2
        sd = state.state_dict()
        if RANK != 0:
            sd["buckets"] = []
        state.load_state_dict(sd)  # every rank re-plans its buckets; rank 0 restores them
    t0 = time.monotonic()
    try:
        train(ddp, opt, [step])
        result(raised=None)
    except Exception as e:  # noqa: BLE001 - the failure is what is tested
        result(raised=type(e).__name__, message=str(e)[:600], after=time.monotonic() - t0)
    state.close()


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    what, d, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "full":
        full(d, int(args[0]))
    elif what == "first":
        first(d, int(args[0]))
    elif what == "resume":
        resume(d, int(args[0]), int(args[1]), args[2])
    elif what == "one_rank":
        one_rank(d, int(args[0]), args[1])
    dist.barrier()
    dist.destroy_process_group()
