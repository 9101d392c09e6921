"""The adaptive rank's numbers. measure: what it measures of one bucket after its allreduce (on
the hook's worker thread inside the bucket's job for a CPU bucket, inline for a CUDA one; either
way before DDP can write the next step's gradients into it): per parameter, |output|^2 and this
rank's |E|^2 and |E + output|^2 (E its residual, read from lowrank's format-2 saved state:
docs/checkpoint.md). accumulate / take_norms: the window's sum of each parameter's output, whose
|.|^2 the hook puts in place of the single step's |output|^2. combine: those numbers summed over
the comm ranks into the signals the rule decides from. Not thread-safe: one job at a time.
"""
import math
import struct

import torch
import torch.distributed as dist

_HEADER = 40  # magic, version, header size, seed, comm size, comm rank, flags, tensors


def residuals(data):
    """{id: residual} of format-2 bytes (lowrank.Communicator.save_state of a buffer declared
    with ids): each a float32 tensor (a view of `data`), empty without error feedback.
    Raises ValueError on bytes that are not format 2."""
    if data[:8] != b"LRSTATE\0" or struct.unpack_from("<I", data, 8)[0] != 2:
        raise ValueError("not lowrank's per-tensor saved state (format 2)")
    (count,) = struct.unpack_from("<I", data, 36)
    at, out = _HEADER, {}
    buf = bytearray(data)  # torch.frombuffer wants a writable buffer
    for _ in range(count):
        tid, ndims = struct.unpack_from("<QI", data, at)
        at += 12 + 8 * ndims + 4 + 8 + 4  # sizes, k, calls, flags
        nres, nq = struct.unpack_from("<QQ", data, at)
        at += 16
        out[tid] = torch.frombuffer(buf, dtype=torch.float32, count=nres, offset=at) if nres \
            else torch.empty(0)
        at += 4 * (nres + nq)
    return out


def measure(comm, buf, ids, shapes):
    """{id: (|out|^2, |E|^2, |E + out|^2)} (float64 sums, this comm rank's) for the declared
    tensors of the bucket `buf` just allreduced in place (ids and shapes as declared, in order).
    Reads the residual through comm.save_state (a device buffer's queued work is waited for).
    Tensors without a residual (exact, in their warm-up) measure |E|^2 = 0."""
    res = residuals(comm.save_state(buf))
    flat, out, at = buf.detach().reshape(-1), {}, 0
    for tid, shape in zip(ids, shapes):
        n = 1
        for d in shape:
            n *= d
        o = flat[at:at + n].double()
        at += n
        e = res.get(tid)
        if e is None or e.numel() != n:
            out[tid] = (float(o.dot(o)), 0.0, float(o.dot(o)))
            continue
        e = e.to(o.device, torch.float64)
        m = e + o
        out[tid] = (float(o.dot(o)), float(e.dot(e)), float(m.dot(m)))
    return out


def accumulate(acc, buf, ids, shapes, keep=None):
    """Adds each declared tensor's part of the bucket `buf`, just allreduced, into acc[id] (at
    its first call a float32 copy of that part on buf's device; the work is queued on the
    current stream like the rest of the job): the sum of the averaged gradient over a window's steps, whose norm is
    Accordion's signal (a single step's norm is mostly sampling noise). keep: the ids to sum
    (None: all). One pass over their part of the bucket; acc holds a float32 copy of their
    gradients (a sum restored on another device moves to the bucket's)."""
    flat, at = buf.detach().reshape(-1), 0
    for tid, shape in zip(ids, shapes):
        n = 1
        for d in shape:
            n *= d
        part = flat[at:at + n]
        at += n
        if keep is not None and tid not in keep:
            continue
        a = acc.get(tid)
        if a is None or a.numel() != n:
            acc[tid] = part.float().clone()
        else:
            if a.device != part.device:
                a = acc[tid] = a.to(part.device)
            a.add_(part)


def take_norms(acc, ids):
    """{id: |acc[id]|^2} (float64) for ids, their sums then dropped, so the next window starts
    from zero."""
    out = {}
    for tid in ids:
        a = acc.pop(tid, None)
        out[tid] = 0.0 if a is None else float(a.double().dot(a.double()))
    return out


def combine(local, group=None):
    """The rule's signals of one measured step, the same numbers on every comm rank:
    {key: (gradient norm, compression error)} from each rank's {key: (|out|^2, |E|^2,
    |E + out|^2)} (measure()'s numbers of the step's buckets, by parameter; the hook puts the
    window's sum of out in place of out): the norm sqrt(sum_i |out|^2 / world) (|out|^2 is alike
    on every rank) and the
    error sqrt(sum_i |E_i|^2 / sum_i |E_i + out|^2) (0 where nothing was sent).
    Collective over `group` (None: the default group): one all_reduce of 3 float64 per key, on
    the current CUDA device where the group's backend is NCCL; every rank must pass the same
    keys (it measured the same buckets). Used by PowerSGDState's adaptive rank on every path."""
    keys = sorted(local)
    vec = torch.tensor([x for key in keys for x in local[key]], dtype=torch.float64)
    if str(dist.get_backend(group)).lower() == "nccl":
        vec = vec.cuda()
    dist.all_reduce(vec, group=group)
    vec, world = vec.cpu().tolist(), dist.get_world_size(group)
    out = {}
    for i, key in enumerate(keys):
        out2, err2, m2 = vec[3 * i:3 * i + 3]
        out[key] = (math.sqrt(out2 / world), math.sqrt(err2 / m2) if m2 > 0 else 0.0)
    return out
