"""One rank of the per-tensor tests (tests/python/test_hook_pertensor.py starts them with
torchrun's variables). A small language model (token embedding, two linear layers, an output
head, a frozen layer) under DDP over gloo with lowrank's hook and exclude / rank_of by name.
Prints one line "RESULT <json>" at the end; the test asserts on it.

    pertensor_worker.py run     phase 1: embedding and head excluded, fc1 at rank 4, the rest at
                                the default 2; phase 2 (set_tensor_ranks): other ranks, the
                                state kept; phase 3: a new model and state loading phase 2's
                                state_dict under other ranks again
    pertensor_worker.py adaptive  AdaptiveRank(low 1, high 4) in three settings (window, lag,
                                eta, error_max): each parameter's k after every step
"""
import copy
import datetime
import json
import logging
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
from lowrank.torch import PowerSGDState, powerSGD_hook  # noqa: E402
import lowrank.torch.execution as hookmod  # noqa: E402  (the jobs call its measure)
from lowrank.torch.adaptive import AdaptiveRank  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
VOCAB, DIM = 64, 32


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.head(self.frozen(x))


def batch(step):
    gen = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randint(0, VOCAB, (8, 12), generator=gen), torch.randint(0, VOCAB, (8, 12), generator=gen)


def loss_of(model, step):
    x, y = batch(step)
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def exact_mean_grads(model, step):
    """Every parameter's gradient averaged exactly over the ranks (a copy of the model, no DDP)."""
    copy = LM()
    copy.load_state_dict(model.state_dict())
    loss_of(copy, step).backward()
    out = {}
    for name, p in copy.named_parameters():
        if p.grad is not None:
            g = p.grad.clone()
            dist.all_reduce(g)
            out[name] = g / WORLD
    return out


def train(ddp, model, opt, steps, first):
    """Steps first..first+steps-1; returns the largest |DDP's gradient - the exact mean| per
    parameter at the first of them, and whether every gradient stayed finite."""
    diffs, finite = {}, True
    for step in range(first, first + steps):
        exact = exact_mean_grads(model, step) if step == first else None
        opt.zero_grad()
        loss_of(ddp, step).backward()
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            finite &= bool(torch.isfinite(p.grad).all())
            if exact is not None:
                diffs[name] = float((p.grad - exact[name]).abs().max())
        opt.step()
    return diffs, finite


def checksum(model):
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def run():
    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger("lowrank.torch").addHandler(Keep(level=logging.WARNING))

    torch.manual_seed(1234)
    model = LM()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=3,
                          timeout=30, exclude=["embed.weight", "head.weight", "frozen.weight"],
                          rank_of={"fc1.weight": 4}, model=ddp)
    ddp.register_comm_hook(state, powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diffs1, finite1 = train(ddp, model, opt, 3, 0)
    ranks1, stats1 = state.tensor_ranks(), state.stats()

    # Phase 2: other ranks for the same parameters, by parameter object and by function.
    state.set_tensor_ranks(exclude=lambda name, p: name == "embed.weight",
                           rank_of={model.fc2.weight: 3, "head.weight": 1})
    diffs2, finite2 = train(ddp, model, opt, 3, 3)
    ranks2, stats2 = state.tensor_ranks(), state.stats()
    sd = state.state_dict()

    # Phase 3: a new model and state (a restart) loading that state under other ranks again.
    model3 = LM()
    model3.load_state_dict(model.state_dict())
    ddp3 = nn.parallel.DistributedDataParallel(model3)
    state3 = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=3,
                           timeout=30, rank_of={"fc1.weight": 5}, model=model3)
    state3.load_state_dict(sd)
    ddp3.register_comm_hook(state3, powerSGD_hook)
    opt3 = torch.optim.SGD(model3.parameters(), lr=0.1)
    _, finite3 = train(ddp3, model3, opt3, 3, 6)
    ranks3, stats3 = state3.tensor_ranks(), state3.stats()
    result(diffs1=diffs1, diffs2=diffs2, finite=[finite1, finite2, finite3],
           ranks=[ranks1, ranks2, ranks3],
           changes=[stats1["rankChanges"], stats2["rankChanges"], stats3["rankChanges"]],
           compressed=[stats1["compressedCalls"], stats3["compressedCalls"]],
           checksum=[checksum(model), checksum(model3)], warnings=warnings)
    state.close()
    state3.close()


def resumed(model, sd, kw):
    """A new model and state with the same rule loading sd: its ks after one more step (no
    decision falls on it) and the changes it counted."""
    model2 = LM()
    model2.load_state_dict(model.state_dict())
    ddp2 = nn.parallel.DistributedDataParallel(model2)
    state2 = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=0,
                           random_seed=3, timeout=30, exclude=["embed.weight"], model=ddp2,
                           adaptive=AdaptiveRank(high=4, **kw))
    state2.load_state_dict(sd)
    ddp2.register_comm_hook(state2, powerSGD_hook)
    train(ddp2, model2, torch.optim.SGD(model2.parameters(), lr=0.1), 1, 7)
    out = {"ranks": state2.tensor_ranks(), "changes": state2.stats()["rankChanges"]}
    state2.close()
    return out


def adaptive():
    """Each setting on a fresh model: the ks after every step, the changes counted, finite."""
    settings = {"window2_lag1": dict(window=2, lag=1, eta=1e9, error_max=None),
                "window1_lag2": dict(window=1, lag=2, eta=1e9, error_max=None),
                "error_keeps_high": dict(window=1, lag=2, eta=1e9, error_max=1e-12),
                "local_signals_differ": dict(window=1, lag=1, eta=1e9, error_max=0.9)}
    out, local = {}, []
    real = hookmod.measure

    def skewed(comm, buf, ids, shapes):
        """Each rank's own |E|^2 made to disagree: x100 on rank 0, x0 on rank 1 (so rank 0's own
        error is far above error_max, rank 1's is 0); the decision must not follow either."""
        got = real(comm, buf, ids, shapes)
        got = {i: (o, e * (100.0 if RANK == 0 else 0.0), m) for i, (o, e, m) in got.items()}
        local.append(max(math.sqrt(e / m) for _, e, m in got.values() if m > 0))
        return got
    for name, kw in settings.items():
        hookmod.measure = skewed if name == "local_signals_differ" else real
        torch.manual_seed(1234)
        model = LM()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=0,
                              random_seed=3, timeout=30, exclude=["embed.weight"], model=ddp,
                              adaptive=AdaptiveRank(high=4, **kw))
        ddp.register_comm_hook(state, powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        history, finite = [], True
        for step in range(7):
            _, ok = train(ddp, model, opt, 1, step)
            finite &= ok
            history.append(state.tensor_ranks())
        out[name] = {"history": history, "changes": state.stats()["rankChanges"],
                     "finite": finite}
        if name == "window2_lag1":  # a restart from the state_dict goes on with the rule's ks
            out["resumed"] = resumed(model, state.state_dict(), kw)
        state.close()
    hookmod.measure = real
    out["local_errors"] = local  # this rank's own largest error, at each skewed measurement
    out["window_sums"] = window_sums()
    out["restarts"] = restarts()
    result(**out)


def restarts():
    """Window 4, lag 1, 16 steps: each step's ks and the rule's last signals in an uninterrupted
    run, and in runs restarted from its state_dict: saved after step 5 (mid-window: 2 of the
    window's 4 steps summed) or after step 7 (measured, its decision due at step 8), each loaded
    into a fresh state, and the one of step 7 also loaded into a running state after step 9
    (a roll-back). Restarts must go on as the run that did not stop."""
    def make():
        torch.manual_seed(1234)
        model = LM()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                              random_seed=3, timeout=30, exclude=["embed.weight"], model=ddp,
                              adaptive=AdaptiveRank(high=4, window=4, lag=1, eta=0.3))
        ddp.register_comm_hook(state, powerSGD_hook)
        return model, ddp, state, torch.optim.SGD(model.parameters(), lr=0.5)

    def steps(ddp, model, opt, state, first, last, log):
        for s in range(first, last):
            train(ddp, model, opt, 1, s)
            log[s] = (state.tensor_ranks(), state.adaptive_signals())

    model, ddp, state, opt = make()
    whole, saved = {}, {}
    for s in range(16):
        steps(ddp, model, opt, state, s, s + 1, whole)
        if s in (5, 7):
            saved[s] = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()),
                        copy.deepcopy(state.state_dict()))
    state.close()
    # a second run, rolled back after step 9 (its window's sums hold steps 8 and 9) to step 7's
    # save (no sums, step 7's numbers pending): nothing of steps 8 and 9 may stay
    model, ddp, state, opt = make()
    steps(ddp, model, opt, state, 0, 10, {})
    m, o, sd = saved[7]
    model.load_state_dict(m)
    opt.load_state_dict(o)
    state.load_state_dict(sd)
    rolled = {}
    steps(ddp, model, opt, state, 8, 16, rolled)
    state.close()
    out = {"whole": {s: v[0] for s, v in whole.items()}, "signals": {}, "ks": {}}
    out["signals"]["whole"] = {s: v[1] for s, v in whole.items()}
    out["ks"]["rolled_back_7"] = {s: v[0] for s, v in rolled.items()}
    out["signals"]["rolled_back_7"] = {s: v[1] for s, v in rolled.items()}
    for cut in (5, 7):
        model, ddp, state, opt = make()
        m, o, sd = saved[cut]
        model.load_state_dict(m)
        opt.load_state_dict(o)
        state.load_state_dict(sd)
        log = {}
        steps(ddp, model, opt, state, cut + 1, 16, log)
        state.close()
        out["ks"][f"restart_{cut}"] = {s: v[0] for s, v in log.items()}
        out["signals"][f"restart_{cut}"] = {s: v[1] for s, v in log.items()}
    return out


def window_sums():
    """Window 3, lag 1: the gradient norm the rule took at step 3 (measured at step 2) against
    the norm of the sum of DDP's averaged gradients of steps 0, 1 and 2 (what lowrank's calls
    returned), and against step 2's alone (which it must not be)."""
    torch.manual_seed(1234)
    model = LM()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=1,
                          random_seed=3, timeout=30, exclude=["embed.weight"], model=ddp,
                          adaptive=AdaptiveRank(high=4, window=3, lag=1))
    ddp.register_comm_hook(state, powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sums, last, taken = {}, {}, None
    for step in range(4):
        train(ddp, model, opt, 1, step)
        if step < 3:
            for name, p in model.named_parameters():
                if p.grad is None:
                    continue
                g = p.grad.detach().double().clone()
                sums[name] = sums[name] + g if name in sums else g
                last[name] = float(g.norm())
        else:
            taken = state.adaptive_signals()
    state.close()
    measured, signals = taken
    return {"measured": measured,
            "rule": {n: v[0] for n, v in signals.items()},
            "sum": {n: float(sums[n].norm()) for n in signals},
            "last": {n: last[n] for n in signals}}


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    {"run": run, "adaptive": adaptive}[sys.argv[1]]()
    dist.barrier()
    dist.destroy_process_group()
