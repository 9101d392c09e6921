"""lowrank for PyTorch: a DDP communication hook with PowerSGD, drop-in for PyTorch's own.

    from lowrank.torch import PowerSGDState, powerSGD_hook
    state = PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=10)
    ddp_model.register_comm_hook(state, powerSGD_hook)

Differences from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook: docs/pytorch.md.
FSDP2's hybrid sharding: lowrank.torch.fsdp (torch >= 2.7; not imported here, so that this
package works on torch 1.13).
"""
from .adaptive import AdaptiveRank
from .hook import PowerSGDState, powerSGD_hook
from .process_group import communicator_from_process_group

__all__ = ["PowerSGDState", "powerSGD_hook", "communicator_from_process_group", "AdaptiveRank"]
