"""PyTorch's powerSGD_hook made safe over gloo with several buckets, two ways: chained (the fair
baseline, `torch-powersgd`) and waited (the old one, `torch-powersgd-waited`).

Why the unwrapped hook aborts over gloo (read in torch 1.13's and 2.15's powerSGD_hook.py, the
same code in both): per bucket it issues three allreduces, the uncompressed tensors' from the
hook's call (on DDP's autograd thread), then P's from a completion callback of that one and Q's
from the next callback. gloo runs those callbacks on its own worker threads whenever the previous
allreduce completes, and ProcessGroupGloo gives each collective the next tag in the order it is
issued on that rank; ranks are paired by tag. With two or more buckets, the autograd thread
issues bucket 1's first allreduce while a gloo thread issues bucket 0's P or Q, in an order that
depends on each rank's timing. When the orders differ, one rank's tag t is bucket 0's P and the
other's is bucket 1's uncompressed tensors: gloo aborts on the size mismatch (or hangs).

The fix keeps the hook's code untouched and orders its collectives as lowrank orders its own
(one bucket after another, in DDP's bucket order, the same on every rank): bucket i's hook is
called only once bucket i-1's future has completed, from that future's callback. Each bucket's
three allreduces are issued one after the other by the hook itself, so every rank issues
(U0, P0, Q0, U1, P1, Q1, ...) in that order. Nothing waits on the autograd thread: backward goes
on computing while the chain runs on gloo's threads, as lowrank's reduction runs on its worker.
The hook's callbacks block the gloo thread running them until P's and Q's allreduces complete
(`.wait()` inside the callback); chained, one bucket at a time does so, and gloo's other worker
thread (ProcessGroupGloo starts 2) runs the collective it waits for.
"""
import torch


def completed(value):
    """A future already holding value."""
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def waited(torch_hook):
    """The hook's future waited inside the call: buckets serialised on the autograd thread, no
    overlap with backward (docs/training.md's `torch-powersgd-waited`)."""
    def hook(state, bucket):
        return completed(torch_hook(state, bucket).wait())
    hook.__name__ = hook.__qualname__ = "waited_" + torch_hook.__name__
    return hook


def chained(torch_hook):
    """torch_hook called for each bucket from the completion of the previous bucket's future
    (the first bucket, or one whose predecessor has completed, from DDP's call itself). One per
    DDP model: it holds the tail of the chain."""
    tail = [None]  # the future of the bucket handed to the chain last

    def hook(state, bucket):
        result = torch.futures.Future()
        prev, tail[0] = tail[0], result

        def start(prev_fut=None):
            if prev_fut is not None:
                try:
                    prev_fut.value()
                except Exception as e:  # noqa: BLE001 - no new collective after a failed one
                    result.set_exception(e)
                    return
            try:
                fut = torch_hook(state, bucket)
            except Exception as e:  # noqa: BLE001 - DDP sees it through the future
                result.set_exception(e)
                return
            fut.add_done_callback(lambda f: _forward(f, result))

        if prev is None:
            start()
        else:
            prev.add_done_callback(start)  # runs at once if prev has completed
        return result
    hook.__name__ = hook.__qualname__ = "chained_" + torch_hook.__name__
    return hook


def _forward(fut, result):
    try:
        value = fut.value()
    except Exception as e:  # noqa: BLE001
        result.set_exception(e)
        return
    result.set_result(value)


def make(kind, process_group, rank, start_iter, seed):
    """(state, hook) for kind "chained" or "waited": PyTorch's PowerSGDState at approximation
    rank `rank`, and the wrapped hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as tp
    state = tp.PowerSGDState(process_group=process_group, matrix_approximation_rank=rank,
                             start_powerSGD_iter=start_iter, random_seed=seed)
    hook = (chained if kind == "chained" else waited)(tp.powerSGD_hook)
    return state, hook
