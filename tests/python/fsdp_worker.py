"""One rank of the FSDP2 HSDP tests (tests/python/test_fsdp.py): 4 processes, 2 replicas x 2
shards over gloo (rank = replica * 2 + shard). Prints "RESULT <json>" at the end.

    fsdp_worker.py native K START          hook (1-D shard mesh) vs native HSDP (2-D mesh)
    fsdp_worker.py match K START           hook vs a Communicator driven directly on the same
                                           flat shards, the layout derived here independently
    fsdp_worker.py match_bf16 K START      the same, both with factor_dtype "bf16"
    fsdp_worker.py accum                   hook calls with set_requires_gradient_sync(False)
    fsdp_worker.py ckpt full|save|resume|nohook DIR   checkpoint with torch.distributed.checkpoint
    fsdp_worker.py peer_death VICTIM       the victim SIGKILLs itself in its hook
"""
import datetime
import hashlib
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
pkgpath.use()
from lowrank.torch import communicator_from_process_group  # noqa: E402
from lowrank.torch import fsdp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import Shard  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
REPLICAS, SHARDS = 2, 2
TIMEOUT = 5  # lowrank's and gloo's, in peer_death


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 64)
        self.fc2 = nn.Linear(64, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Three FSDP groups (two blocks, the root); the root owns a parameter of its own (scale,
    packed last by FSDP's post-order), a frozen weight, a head of 5 rows (3 + 2 rows and a
    padding row over 2 shards) and odd 1-D sizes (padding)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(7) + 0.1 * torch.randn(7))
        self.emb = nn.Linear(12, 40)
        self.blocks = nn.ModuleList([Block(40) for _ in range(2)])
        self.frozen = nn.Linear(40, 40)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(40, 5)

    def forward(self, x):
        x = torch.relu(self.emb(x))
        for b in self.blocks:
            x = b(x)
        return self.head(self.frozen(x)) * self.scale[:5]


def make(mesh):
    torch.manual_seed(1234)
    model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(step):
    g = torch.Generator().manual_seed(1000 * RANK + step)
    return torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)


def train_step(model, opt, step):
    x, y = batch(step)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def meshes():
    mesh = init_device_mesh("cpu", (REPLICAS, SHARDS), mesh_dim_names=("replicate", "shard"))
    return mesh, mesh["shard"], mesh["replicate"].get_group()


def local(model):
    return {n: p.to_local().detach().clone() for n, p in model.named_parameters()}


def native(k, start, steps=4):
    """The hook at no compression vs native HSDP: the local shards after each step."""
    mesh2, shard_mesh, rgroup = meshes()
    ref, mine = make(mesh2), make(shard_mesh)
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=k, start_powerSGD_iter=start)
    fsdp.register(mine, state)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, mine)]
    diffs, first = [], local(ref)
    for step in range(steps):
        for m, o in zip((ref, mine), opts):
            train_step(m, o, step)
        a, b = local(ref), local(mine)
        diffs.append(max((a[n] - b[n]).abs().max().item() for n in a if a[n].numel()))
    moved = min((a[n] - first[n]).abs().max().item() for n in a
                if a[n].numel() and n != "frozen.weight")
    st = state.stats()
    result(diffs=diffs, moved=moved, calls=st["calls"], compressed=st["compressedCalls"],
           placements=str(next(ref.parameters()).placements))
    state.close()


def shards4(steps=2):
    """1 replica x 4 shards: the 5-row head leaves shard 3 empty (padding only), scale's 7
    elements are 2 + 2 + 2 + 1. At k = 0 over a replica group of one the hook must leave every
    flat shard as it is: the shards equal those of the same model without a hook, bit for bit."""
    mesh = init_device_mesh("cpu", (1, 4), mesh_dim_names=("replicate", "shard"))
    ref, mine = make(mesh["shard"]), make(mesh["shard"])
    state = fsdp.PowerSGDState(mesh["replicate"].get_group(), matrix_approximation_rank=0)
    fsdp.register(mine, state)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, mine)]
    for step in range(steps):
        for m, o in zip((ref, mine), opts):
            train_step(m, o, step)
    a, b = local(ref), local(mine)
    rows = {r.fqn: r.rows for rs in state.layouts().values() for r in rs}
    result(same=all(torch.equal(a[n], b[n]) for n in a), rows=rows,
           calls=state.stats()["calls"])
    state.close()


# ---- an independent layout: from the plain model's parameters and torch.chunk -------------------
def expected_layout(groups):
    """{group name: [(fqn, full shape)]} in FSDP's packing order, for Net: per group, the
    parameters of its own submodules (named order), then those of the group's module itself;
    frozen ones left out. Derived from a plain Net, not from lowrank.torch.fsdp."""
    plain = Net()
    out = {}
    for g in groups:
        prefix = g + "." if g else ""
        nested = [h + "." for h in groups if h != g and h.startswith(prefix)]
        own, subs = [], []
        for n, p in plain.named_parameters():
            if not n.startswith(prefix) or any(n.startswith(h) for h in nested) \
                    or not p.requires_grad:
                continue
            (own if "." not in n[len(prefix):] else subs).append((n, tuple(p.shape)))
        out[g] = subs + own
    return out


def declaration(params, shard):
    """lowrank's tensors for one group's flat shard, by the rule docs/pytorch.md states: per
    parameter its rows of the chunk (id BLAKE2b-64 of "fqn|shard|shards|data"), then its
    padding, 1-D exact (part "padding")."""
    def tid(n, part):
        key = f"{n}|{shard}|{SHARDS}|{part}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    decl, numel = [], 0
    for n, shape in params:
        chunk = -(-shape[0] // SHARDS)
        rows = max(0, min(chunk, shape[0] - shard * chunk))
        rest = 1
        for d in shape[1:]:
            rest *= d
        if rows:
            decl.append((tid(n, "data"), (rows, *shape[1:])))
        if (chunk - rows) * rest:
            decl.append((tid(n, "padding"), ((chunk - rows) * rest,), 0))
        numel += chunk * rest
    return decl, numel


def match(k, start, steps=6, factor_dtype="fp32"):
    """Each group's reduced flat shard vs a second communicator with the same settings driven
    directly on a copy of the flat input, declared with the independent layout: bit for bit."""
    _, shard_mesh, rgroup = meshes()
    model = make(shard_mesh)
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=k, start_powerSGD_iter=start,
                               random_seed=7, factor_dtype=factor_dtype)
    hooks = fsdp.register(model, state)
    ref = communicator_from_process_group(rgroup, "cpu", approx_rank=k, seed=7, start_iter=start,
                                          min_compression_rate=2.0, factor_dtype=factor_dtype)
    names = {m: n for n, m in model.named_modules()}
    groups = [names[m] for m, _ in hooks]
    layout = expected_layout(groups)
    shard = dist.get_rank(shard_mesh.get_group())
    refbufs, mismatches, compared, pad_nonzero, sizes = {}, [], 0, 0, {}
    for m, hook in hooks:
        g = names[m]
        decl, numel = declaration(layout[g], shard)
        sizes[g] = numel

        def spy(flat, _hook=hook, _g=g, _decl=decl):
            nonlocal compared, pad_nonzero
            inp = flat.clone()
            _hook(flat)
            buf = refbufs.setdefault(_g, torch.empty_like(inp))
            buf.copy_(inp)
            ref.set_tensors(buf, _decl)
            ref.allreduce(buf, op="avg")
            compared += 1
            if not torch.equal(buf, flat):
                mismatches.append(f"{_g}: max diff {(buf - flat).abs().max().item():.3g}")
        m.set_all_reduce_hook(spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        train_step(model, opt, step)
    st = state.stats()
    lay = {g: [r.fqn for r in rs] for g, rs in state.layouts().items()}
    result(mismatches=mismatches, compared=compared, groups=len(groups), steps=steps,
           compressed=st["compressedCalls"], calls=st["calls"], ratio=st["ratio"],
           factor_dtype=state.communicator().config()["factor_dtype"],
           layout_same=lay == {g: [n for n, _ in v] for g, v in layout.items()},
           sizes_same=all(sizes[u.name] == u.numel for u in state._units))
    state.close()
    ref.destroy()


def accum(micro=3, steps=3):
    """Micro-batches with set_requires_gradient_sync(False) but the last: the hook runs once
    per group per step; with sync at every micro-batch, once per group per micro-batch."""
    _, shard_mesh, rgroup = meshes()
    model = make(shard_mesh)
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=2, start_powerSGD_iter=1)
    hooks = fsdp.register(model, state)
    calls = []
    for m, hook in hooks:
        m.set_all_reduce_hook(lambda flat, _h=hook: (calls.append(1), _h(flat)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_micro = {"nosync": [], "sync": []}
    for mode in ("nosync", "sync"):
        for step in range(steps):
            opt.zero_grad()
            for i in range(micro):
                model.set_requires_gradient_sync(mode == "sync" or i == micro - 1)
                before = len(calls)
                x, y = batch(step * micro + i)
                nn.functional.cross_entropy(model(x), y).backward()
                per_micro[mode].append(len(calls) - before)
            opt.step()
    result(groups=len(hooks), micro=micro, **per_micro)
    state.close()


def peer_death(victim):
    """The victim SIGKILLs itself in its hook at step 3; the others must raise."""
    _, shard_mesh, rgroup = meshes()
    model = make(shard_mesh)
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=2, start_powerSGD_iter=1,
                               timeout=TIMEOUT)
    hooks = fsdp.register(model, state)
    step_now = [0]
    for m, hook in hooks:
        def spy(flat, _h=hook):
            if RANK == victim and step_now[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            _h(flat)
        m.set_all_reduce_hook(spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t0 = None
    try:
        for step in range(50):
            step_now[0] = step
            t0 = time.monotonic()
            train_step(model, opt, step)
    except Exception as e:  # noqa: BLE001 - any failure is what we wait for
        result(raised=type(e).__name__, message=str(e)[:300], after=time.monotonic() - t0)
        os._exit(0)  # gloo's teardown with a dead peer can block: not what is tested
    result(raised=None)


def _message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return None


def errors():
    """One process: each misuse raises a clear error; the divide-factor convention."""
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    rgroup = mesh["replicate"].get_group()
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=2, start_powerSGD_iter=0)
    out = {"plain": _message(lambda: fsdp.register(Net(), state)),
           "mesh2d": _message(lambda: fsdp.register(make(mesh), state))}
    m = Net()
    fully_shard(m, mesh=mesh["shard"], shard_placement_fn=lambda p: Shard(1) if p.dim() == 2
                else Shard(0))
    out["shard1"] = _message(lambda: fsdp.register(m, state))
    out["units_after_refusal"] = len(state._units)  # a refused register sets nothing
    out["load_before_register"] = _message(lambda: state.load_state_dict(
        {"format": fsdp._FORMAT, "version": 1, "config": {}, "replica": 0, "replicas": 1,
         "params": {}}))
    out["malformed"] = _message(lambda: state.load_state_dict(
        {"format": fsdp._FORMAT, "version": 1}))
    only_blocks = Net()  # the root not sharded: its own parameters would be reduced by nobody
    for b in only_blocks.blocks:
        fully_shard(b, mesh=mesh["shard"])
    out["outside"] = _message(lambda: fsdp.register(only_blocks, state))
    model = make(mesh["shard"])
    fsdp.register(model, state)
    out["twice"] = _message(lambda: fsdp.register(model, state))
    out["second_model"] = _message(lambda: fsdp.register(make(mesh["shard"]), state))
    out["op"] = fsdp._fsdp_op(model)
    model.set_gradient_divide_factor(3.0)
    out["op_factor"] = fsdp._fsdp_op(model)
    # a step in which a parameter gets no gradient: FSDP leaves it out of the flat output
    model2 = make(mesh["shard"])
    state.close()  # a state per model
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=2, start_powerSGD_iter=0)
    fsdp.register(model2, state)
    x, _ = batch(0)

    def unused():  # the blocks and scale unused; through the root's call (FSDP's hooks)
        model2.forward = lambda x: model2.head(model2.frozen(torch.relu(model2.emb(x))))
        model2(x).sum().backward()
    out["unused"] = _message(unused)
    model3 = make(mesh["shard"])  # the fix the message names: FSDP reduces zeros for them
    model3.set_reduce_scatter_unused_params(True)
    state.close()
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=2, start_powerSGD_iter=0)
    fsdp.register(model3, state)
    model3.forward = lambda x: model3.head(model3.frozen(torch.relu(model3.emb(x))))
    out["unused_fixed"] = _message(lambda: model3(x).sum().backward())
    state.close()
    out["closed"] = _message(lambda: state.state_dict())
    result(**out)


if __name__ == "__main__":
    timeout = TIMEOUT if sys.argv[1] == "peer_death" else 60
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    what, args = sys.argv[1], sys.argv[2:]
    if what == "ckpt":
        import fsdp_ckpt
        fsdp_ckpt.main(*args)
    else:
        {"native": native, "match": match, "accum": accum, "errors": errors, "shards4": shards4,
         "peer_death": peer_death,
         "match_bf16": lambda k, start: match(k, start, steps=3, factor_dtype="bf16")}[what](
            *[int(a) for a in args])
    dist.barrier()
    dist.destroy_process_group()
