"""The checkpoint part of fsdp_worker.py: FSDP's sharded state (model and SGD momentum) by
torch.distributed.checkpoint, the hook's state by torch.save, one file per rank.

    ckpt save DIR     FIRST + THEN steps uninterrupted, saving after FIRST (which must not
                      disturb the run: resume == this run)
    ckpt resume DIR   new model, optimizer and hook state loaded, THEN steps
    ckpt nohook DIR   the same without the hook's state (must differ)
Each reports a digest of every local parameter shard after the last step, and lowrank's
counters: per step, the payload elements it added and the factor sizes of the groups' buffers
(Communicator.view: [pElements, qElements, exactElements] of a compressed call; a group with
nothing compressed: [0, 0, its element count]).
Variables: FSDP_ALTERNATE=1 (the hook's alternate=True), FSDP_CKPT_FIRST (FIRST, default 3).
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fsdp_worker import RANK, make, meshes, result, train_step
from lowrank.torch import fsdp

FIRST, THEN = int(os.environ.get("FSDP_CKPT_FIRST", "3")), 3
K, START = 2, 1
ALTERNATE = os.environ.get("FSDP_ALTERNATE") == "1"


def setup():
    _, shard_mesh, rgroup = meshes()
    model = make(shard_mesh)
    state = fsdp.PowerSGDState(rgroup, matrix_approximation_rank=K, start_powerSGD_iter=START,
                               random_seed=3, alternate=ALTERNATE)
    fsdp.register(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, state


def digest(model):
    h = {}
    for n, p in model.named_parameters():
        h[n] = hashlib.sha256(p.to_local().detach().numpy().tobytes()).hexdigest()[:16]
    return h


def main(mode, path):
    model, opt, state = setup()
    steps = range(FIRST + THEN) if mode == "save" else range(FIRST, FIRST + THEN)
    saved = None
    if mode in ("resume", "nohook"):
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        if mode == "resume":
            saved = torch.load(os.path.join(path, f"hook{RANK}.pt"), weights_only=True)
            state.load_state_dict(saved)
    held, payload, factors = 0, [], []
    before = state.stats()["payloadElements"]
    for step in steps:
        train_step(model, opt, step)
        now = state.stats()["payloadElements"]
        payload.append(now - before)
        before = now
        p = q = e = 0
        for unit in state._units:  # each group's buffer of this step (the hook's own record)
            if unit.ptr is None:  # nothing to reduce: no call
                continue
            v = state.communicator().view(unit.ptr)
            if v["ncompressed"]:
                p, q, e = p + v["pElements"], q + v["qElements"], e + v["exactElements"]
            else:
                e += unit.numel
        factors.append([p, q, e])
        if mode == "save" and step == FIRST - 1:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
            sd = state.state_dict()
            held = sum(e["state"] is not None for e in sd["params"].values())
            torch.save(sd, os.path.join(path, f"hook{RANK}.pt"))
            dist.barrier()
    result(digest=digest(model), held=held,
           loaded=0 if saved is None else sum(e["state"] is not None
                                              for e in saved["params"].values()),
           compressed=state.stats()["compressedCalls"], payload=payload, factors=factors,
           alternate=state.communicator().config()["alternate"])
    state.close()
