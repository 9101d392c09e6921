"""A lowrank communicator over the ranks of a torch.distributed process group."""
import re

import torch
import torch.distributed as dist

from ..comm import Communicator, get_unique_id, nccl_unique_id
from ..errors import LowrankError, error_for


def require_initialized():
    """Raise LowrankError (lowrankInvalidUsage) unless torch.distributed is usable."""
    if not dist.is_available():
        raise LowrankError(5, "this torch was built without torch.distributed", "lowrank.torch")
    if not dist.is_initialized():
        raise LowrankError(5, "torch.distributed is not initialized: call "
                              "torch.distributed.init_process_group() first", "lowrank.torch")


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, group_rank)


_COMM_RANK = re.compile(r"\bcomm rank (\d+)( of \d+)?")


def with_global_ranks(error, global_ranks, group_name):
    """`error` (a LowrankError of a communicator over a process group) with each "comm rank N" of
    its message told apart from torch's rank: "comm rank N of the <group_name> (global rank G)",
    the group named at its first mention. global_ranks: the group's global ranks in group-rank
    order (dist.get_process_group_ranks). The same class and code; a number outside the group
    (not a rank) is left as it is."""
    named = []

    def name(m):
        n = int(m.group(1))
        if n >= len(global_ranks):
            return m.group(0)
        where = "" if named else (" in the " if m.group(2) else " of the ") + group_name
        named.append(n)
        return f"{m.group(0)}{where} (global rank {global_ranks[n]})"

    message = _COMM_RANK.sub(name, error.message)
    if message == error.message:
        return error
    return error_for(error.code, message, error.function).with_traceback(error.__traceback__)


def communicator_from_process_group(group=None, device="cpu", **config):
    """A Communicator over the ranks of `group` (None: the default group), comm rank = the rank in
    the group. Collective over the group: every member must call it at the same point.

    device "cpu": a host communicator (UCX); lowrank's unique id is broadcast over the group, so
    any init method and launcher works. device "cuda": a new NCCL communicator on the current CUDA
    device (its NCCL unique id broadcast over the group), owned by the returned Communicator.
    config: keywords of lowrank.comm.CONFIG_FIELDS (approx_rank, seed, timeout, ...).
    Raises LowrankError (torch.distributed not initialized; lowrank's init errors)."""
    require_initialized()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    make_id = get_unique_id if device == "cpu" else nccl_unique_id
    # A failure to make the id on rank 0 must not leave the others waiting in the broadcast:
    # rank 0 sends the error instead, and every rank raises it.
    payload = [None]
    if rank == 0:
        try:
            payload[0] = make_id()
        except LowrankError as e:
            payload[0] = e
    dist.broadcast_object_list(payload, src=_global_rank(group, 0), group=group,
                               **({"device": torch.device("cuda", torch.cuda.current_device())}
                                  if device == "cuda" and _bcast_takes_device() else {}))
    if isinstance(payload[0], LowrankError):
        raise payload[0]
    if device == "cpu":
        return Communicator.init_rank(size, payload[0], rank, **config)
    return Communicator.from_nccl_id(size, payload[0], rank, **config)


def _bcast_takes_device():
    import inspect
    return "device" in inspect.signature(dist.broadcast_object_list).parameters
