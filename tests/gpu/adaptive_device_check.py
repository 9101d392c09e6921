#!/usr/bin/env python3
"""The adaptive rank on the device path (issue 28): comm ranks fed different local signals switch
at the same step to the same k. Run by meson on the CPU emulation of CUDA with the NCCL test
double (gpu_adaptive_same_step_emulated); tests/python/test_hook_pertensor.py holds the host path.

Each of RANKS processes has a device communicator (lowrankCommInitNcclRank) and one device buffer
of three matrices and a bias, declared with ids and a k per id as the hook declares them, and
drives the hook's own pieces: lowrank.torch.signals.measure after the allreduce of a measured step
(it waits for the buffer's queued device work, as in the hook), signals.combine over a gloo group
at the deciding step, AdaptiveRank.decide. Gradients are copied in on a non-blocking stream and
each call is queued on it; the host synchronizes the stream only after a measurement has read the
buffer (to check that it read the call's output), so when the device work runs is otherwise the
emulation's choice (LOWRANK_EMU_SEED: in a random order).

Each rank's gradient is (1 + rank) * scale(step) * u v^T plus noise of its own, scale 1 before
step 5 and 4 from it, so each rank's own residual and error differ (the averaged output, whose norm
the detector follows, is the same bits everywhere); window 2, lag 1, eta 0.5 decide from
the steps 1, 3, 5, 7, 9 measured: high (4) at first, low (1) from step 4, high from step 6 (the
norm grew 4 times), low from step 8. A second run skews each rank's own |E|^2 across error_max
(x1e6 on rank 0, x0 on the others): alone, rank 0 would keep high and the others follow the
detector; together every rank keeps high (the combined error is above error_max), at every step.

  adaptive_device_check.py            launch RANKS workers; exit 0 when every check holds
  adaptive_device_check.py worker     one rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
Needs LOWRANK_TEST_CUDA_EMU (the emulation's libcuda.so.1), LOWRANK_LIBRARY, LOWRANK_CUDA_BACKEND
and LOWRANK_NCCL_LIBRARY (meson sets them). Exits 77 (skip) without torch.
"""
import ctypes
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the root: studies/lib/ports.py
from studies.lib.ports import free_master_port  # noqa: E402
RANKS, STEPS = 2, 12
SHAPES = [(64, 32), (32, 48), (40, 24), (32,)]
IDS = [101, 202, 303, 404]
MATRICES = [i for i, s in enumerate(SHAPES) if len(s) >= 2]
LOW, HIGH = 1, 4
# The k every matrix must have in force at each step (see the docstring).
EXPECTED = [HIGH] * 4 + [LOW] * 2 + [HIGH] * 2 + [LOW] * 4
SETTINGS = {"detector": dict(window=2, lag=1, eta=0.5, error_max=None),
            "skewed_errors": dict(window=2, lag=1, eta=0.5, error_max=0.9)}


def scale(step):
    return 1.0 if step < 5 else 4.0


class Device:
    """The emulation's runtime, called as a CUDA program would (ctypes on its libcuda.so.1)."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # liblowrank's pointer query finds it
        for fn in ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
                   "cudaStreamCreateWithFlags", "cudaStreamSynchronize", "cudaStreamDestroy"):
            getattr(self.lib, fn).restype = ctypes.c_int

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: cuda error {rc}")

    def malloc(self, nbytes):
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)), "cudaMalloc")
        return p.value

    def stream(self):
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreate")
        return s.value

    def copy_in_async(self, dst, host, stream):  # host: a CPU tensor
        self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(host.data_ptr()),
                                            ctypes.c_size_t(host.numel() * 4), 1,
                                            ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def copy_out(self, host, src):  # synchronous, on the legacy default stream
        self.check(self.lib.cudaMemcpy(ctypes.c_void_p(host.data_ptr()), ctypes.c_void_p(src),
                                       ctypes.c_size_t(host.numel() * 4), 2), "cudaMemcpy")


def gradients(torch, rank, step):
    gen = torch.Generator().manual_seed(7)  # u, v: alike on every rank
    out = []
    for shape in SHAPES:
        if len(shape) == 2:
            g = torch.outer(torch.randn(shape[0], generator=gen), torch.randn(shape[1], generator=gen))
        else:
            g = torch.randn(shape, generator=gen)
        out.append(g * (1 + rank) * scale(step))
    noise = torch.Generator().manual_seed(1000 * rank + step)
    flat = torch.cat([g.reshape(-1) for g in out])
    return (flat + 0.01 * torch.randn(flat.numel(), generator=noise)).contiguous()


def run(torch, dev, comm, setting, rank):
    """One setting on a fresh buffer and ids of its own: the ks in force after every step, the
    changes counted, the output."""
    from lowrank import comm as commmod
    from lowrank.torch import signals
    from lowrank.torch.adaptive import AdaptiveRank

    rule = AdaptiveRank(LOW, HIGH, **SETTINGS[setting]).bind(LOW)
    n = sum(torch.Size(s).numel() for s in SHAPES)
    ptr, stream = dev.malloc(4 * n), dev.stream()
    # The device buffer as a CPU tensor over the same bytes: measure() reads it (after waiting)
    # as the hook reads a CUDA bucket; lowrank takes the pointer, which the driver says is device.
    buf = torch.frombuffer((ctypes.c_float * n).from_address(ptr), dtype=torch.float32)
    shapes = [tuple(s) for s in SHAPES]
    ids = [i + 1000 * list(SETTINGS).index(setting) for i in IDS]
    before = comm.stats()
    ks, pending, kept, history, local_errors, measured = {}, {}, [], [], [], []
    for step in range(STEPS):
        m = rule.decides(step)
        if m is not None:  # the hook's _adapt: this rank's numbers of step m, combined
            ks.update(rule.decide(signals.combine(pending.pop(m), group=None)))
        comm.set_tensors(ptr, [(ids[i], SHAPES[i], ks.get(ids[i], rule.initial()) if i in MATRICES else -1)
                               for i in range(len(SHAPES))])
        g = gradients(torch, rank, step)
        kept.append(g)
        dev.copy_in_async(ptr, g, stream)
        # As Communicator.allreduce with a CUDA tensor on `stream` (buf is a CPU tensor here).
        comm._call("lowrankAllReduce", ctypes.c_void_p(ptr), ctypes.c_void_p(ptr), n,
                   commmod._capi.DTYPES["float32"], commmod._capi.OPS["avg"], commmod._COMM,
                   ctypes.c_void_p(stream))
        if rule.measures(step):
            got = signals.measure(comm, buf, ids, shapes)
            # What measure read must be this call's output: the same numbers as the output
            # read once the stream has finished (and, as the outputs, alike on every rank).
            seen = [got[i][0] for i in ids]
            dev.check(dev.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")
            host = torch.empty(n)
            dev.copy_out(host, ptr)
            at, want = 0, []
            for shape in SHAPES:
                o = host[at:at + torch.Size(shape).numel()].double()
                at += o.numel()
                want.append(float(o.dot(o)))
            measured.append({"step": step, "out2": seen, "after_sync": want})
            if setting == "skewed_errors":
                got = {i: (o, e * (1e6 if rank == 0 else 0.0), s) for i, (o, e, s) in got.items()}
                local_errors.append(max((e / s) ** 0.5 for _, e, s in got.values() if s > 0))
            pending[step] = got
        history.append(comm.tensor_ranks(ptr))
    out = torch.empty(n)
    dev.check(dev.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")
    dev.copy_out(out, ptr)  # the legacy default stream does not wait for a non-blocking one
    after = comm.stats()
    counts = {k: after[k] - before[k] for k in ("rankChanges", "compressedCalls", "fallbackCalls")}
    comm.release(ptr)
    dev.check(dev.lib.cudaStreamDestroy(ctypes.c_void_p(stream)), "cudaStreamDestroy")
    dev.check(dev.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")
    return {"history": history, "changes": counts["rankChanges"], "counts": counts,
            "finite": bool(torch.isfinite(out).all()),
            "output": hashlib.sha256(out.numpy().tobytes()).hexdigest(), "local_errors": local_errors,
            "measured": measured}


def worker():
    # The emulation first: a CUDA build of torch must not bring the real runtime in before it.
    dev = Device(os.environ["LOWRANK_TEST_CUDA_EMU"])
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("SKIP: no torch")
        return 77
    if torch.version.cuda:
        print(f"SKIP: torch {torch.__version__} is built with CUDA: this check needs a CPU-only torch "
              "beside the emulation's runtime")
        return 77
    from lowrank.comm import Communicator, nccl_unique_id
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    uid = [nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = Communicator.from_nccl_id(world, uid[0], rank, approx_rank=LOW, start_iter=0, seed=3,
                                     timeout=30)
    out = {name: run(torch, dev, comm, name, rank) for name in SETTINGS}
    comm.destroy()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        return worker()
    env = dict(os.environ, WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_master_port()))
    logs = [tempfile.TemporaryFile("w+") for _ in range(RANKS)]  # not pipes: no rank blocks on its output
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker"],
                              stdout=logs[r], stderr=subprocess.STDOUT, text=True,
                              env=dict(env, RANK=str(r), NCCL_HOSTID=f"lowrank-adaptive-host{r}"))
             for r in range(RANKS)]
    res, failed = [], False
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            print(f"FAILED: rank {r} still running after 240 s")
            failed = True
        logs[r].seek(0)
        text = logs[r].read()
        if p.returncode == 77:
            print(text)
            for q in procs:
                q.kill()
                q.wait()
            return 77
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            print(text)
            print(f"FAILED: rank {r} exited {p.returncode}")
            failed = True
            continue
        res.append(json.loads(lines[-1][len("RESULT "):]))
    if failed:
        return 1
    checks = []

    def check(ok, what):
        checks.append(ok)
        print(("ok: " if ok else "FAILED: ") + what)
    for name in SETTINGS:
        runs = [r[name] for r in res]
        check(all(r["history"] == runs[0]["history"] for r in runs),
              f"{name}: every rank has the same k in force at every step")
        check(all(r["output"] == runs[0]["output"] for r in runs), f"{name}: outputs bit-identical")
        check(all(r["finite"] for r in runs), f"{name}: outputs finite")
        check(all(m["out2"] == m["after_sync"] for r in runs for m in r["measured"]) and
              all(r["measured"] == runs[0]["measured"] for r in runs) and
              len(runs[0]["measured"]) == STEPS // 2,
              f"{name}: each measurement read its call's output (as read after the stream "
              "finished, and alike on every rank)")
        check(all(r["changes"] == runs[0]["changes"] for r in runs), f"{name}: rank changes counted alike")
        check(all(r["counts"]["compressedCalls"] == STEPS and r["counts"]["fallbackCalls"] == 0
                  for r in runs), f"{name}: every call compressed on the device path ({[r['counts'] for r in runs]})")
        for t, ranks in enumerate(runs[0]["history"]):
            check(ranks[len(SHAPES) - 1] == 0, f"{name}: step {t}: the bias exact")
    hist = res[0]["detector"]["history"]
    got = [[h[i] for i in MATRICES] for h in hist]
    check(all(g == [k] * len(MATRICES) for g, k in zip(got, EXPECTED)),
          f"detector: the ks follow the schedule {EXPECTED} (got {got})")
    check(res[0]["detector"]["changes"] == 3 * len(MATRICES),
          f"detector: {3 * len(MATRICES)} rank changes counted (got {res[0]['detector']['changes']})")
    skewed = [[h[i] for i in MATRICES] for h in res[0]["skewed_errors"]["history"]]
    check(all(g == [HIGH] * len(MATRICES) for g in skewed),
          f"skewed_errors: high at every step on every rank (got {skewed})")
    errs = [r["skewed_errors"]["local_errors"] for r in res]
    check(all(e >= 0.9 for e in errs[0]) and all(e == 0 for r in errs[1:] for e in r),
          f"skewed_errors: rank 0's own error is above error_max, the others' 0 ({errs})")
    print(f"{sum(checks)} of {len(checks)} checks passed")
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
