"""One DDP comm hook that hands each step's buckets to the reducer of the current block
(studies/switch/driver.py). Each reducer keeps its own state for the whole run: PyTorch's and
lowrank's PowerSGD states (residuals, warm-start Q, warm-up counts) go on from the end of that
reducer's previous block. A step is reduced by one reducer only: `use()` is called between steps
(DDP has waited every bucket's future when backward returns), so no two reducers' collectives
are ever in flight together.
"""
import os

from studies.train import torch_baseline

NAMES = ["local", "allreduce", "fp16", "torch-powersgd", "lowrank", "lowrank-ring", "lowrank-bf16",
         "lowrank-alternate", "lowrank-alternate-bf16"]
# lowrank's hook, each with its own state and communicator: {name: its PowerSGDState options and
# LOWRANK_UCX_ALGO (None: the library's measured choice)}. -ring: the ring forced; -alternate:
# alternating PowerSGD (issue 44); -bf16: factors in bfloat16 on the wire (issue 45).
LOWRANK = {
    "lowrank": ({}, None),
    "lowrank-ring": ({}, "ring"),
    "lowrank-bf16": ({"factor_dtype": "bf16"}, None),
    "lowrank-alternate": ({"alternate": True}, None),
    "lowrank-alternate-bf16": ({"alternate": True, "factor_dtype": "bf16"}, None),
}


def _local(_state, bucket):
    """No reduction: the compute-only floor."""
    return torch_baseline.completed(bucket.buffer())


class Switch:
    """hook(state, bucket) for DDP's register_comm_hook (its state argument is unused); the
    reducers' (state, hook) pairs made once, on every rank at the same point (lowrank's state
    makes its communicator: a collective)."""

    def __init__(self, names, rank, start_iter, seed):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        self.reducers = {}
        for name in names:
            if name == "local":
                self.reducers[name] = (None, _local)
            elif name == "allreduce":  # full precision through a hook, as the others are
                self.reducers[name] = (None, default_hooks.allreduce_hook)
            elif name == "fp16":
                self.reducers[name] = (None, default_hooks.fp16_compress_hook)
            elif name == "torch-powersgd":
                self.reducers[name] = torch_baseline.make("chained", None, rank, start_iter, seed)
            elif name in LOWRANK:
                self.reducers[name] = _lowrank(rank, start_iter, seed, *LOWRANK[name])
            else:
                raise ValueError(f"unknown reducer {name!r}; known: {', '.join(NAMES)}")
        self.current = names[0]

    def use(self, name):
        """The reducer of the next steps; call between steps only."""
        if name not in self.reducers:
            raise ValueError(f"reducer {name!r} was not made")
        self.current = name

    def hook(self, _state, bucket):
        state, fn = self.reducers[self.current]
        return fn(state, bucket)

    def lowrank_states(self):
        """{name: PowerSGDState} of the lowrank reducers made."""
        return {n: self.reducers[n][0] for n in LOWRANK if n in self.reducers}

    def close(self):
        for st in self.lowrank_states().values():
            st.close()


def _lowrank(rank, start_iter, seed, options, algo):
    """lowrank's (state, hook); options: more PowerSGDState arguments; algo: LOWRANK_UCX_ALGO while
    its communicator is made (read at creation, docs/environment.md), None for the library's
    measured choice."""
    from lowrank.torch import PowerSGDState, powerSGD_hook
    old = os.environ.pop("LOWRANK_UCX_ALGO", None)
    try:
        if algo:
            os.environ["LOWRANK_UCX_ALGO"] = algo
        state = PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                              start_powerSGD_iter=start_iter, random_seed=seed, **options)
        state.communicator("cpu")  # made now, under this environment
    finally:
        os.environ.pop("LOWRANK_UCX_ALGO", None)
        if old is not None:
            os.environ["LOWRANK_UCX_ALGO"] = old
    return state, powerSGD_hook
