"""lowrank's device memory from PyTorch's caching allocator (lowrankCommSetAllocator, issue 41).

A CUDA communicator of the hook takes every byte of its buckets' state (residuals, factors,
payloads, launch tables, workspaces) as uint8 tensors of torch's allocator, allocated on the
stream of the call that plans the bucket: the bucket's side stream, which lowrank joins. So torch
counts it (torch.cuda.memory_allocated), reuses its cache for it, frees its cache and retries
before it gives up, and an out-of-memory is torch.cuda.OutOfMemoryError raised by backward (the
call fails on every rank, nothing changes: lowrank.h) instead of a bucket silently allreduced
exactly. lowrank's pinned host memory stays its own.
"""
import torch


class TorchAllocator:
    """alloc and free of lowrank.Communicator.set_allocator over torch's caching allocator, for
    CUDA device `device` (a torch.device, or what it takes).

    alloc(nbytes, stream): a uint8 tensor of nbytes, allocated on `stream` (a cudaStream_t as an
    int, the planning call's; 0: the current stream), held until free; returns its address.
    Raises what torch raises (torch.cuda.OutOfMemoryError), which the call re-raises.
    free(address, stream): the tensor is marked as used on `stream` (record_stream: torch reuses
    its block once that stream's work so far has run) and dropped.
    Thread safety: called inside the communicator's calls, which are serialized."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._held = {}  # address -> tensor

    def alloc(self, nbytes, stream):
        with torch.cuda.stream(self._stream(stream)):
            t = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._held[t.data_ptr()] = t
        return t.data_ptr()

    def free(self, address, stream):
        t = self._held.pop(address, None)
        if t is not None and stream:
            t.record_stream(self._stream(stream))

    @property
    def held_bytes(self):
        """Bytes lowrank holds of torch's memory now."""
        return sum(t.numel() for t in self._held.values())

    def _stream(self, handle):
        if not handle:
            return torch.cuda.current_stream(self.device)
        return torch.cuda.ExternalStream(handle, device=self.device)


def use_torch_memory(comm, device):
    """Makes `comm` (a CUDA lowrank.Communicator) take its device memory from torch's allocator
    for `device` from now on; returns the TorchAllocator. A library without
    lowrankCommSetAllocator leaves lowrank's own allocation (returns None)."""
    if not hasattr(comm._lib, "lowrankCommSetAllocator"):
        return None
    allocator = TorchAllocator(device)
    comm.set_allocator(allocator.alloc, allocator.free)
    return allocator
