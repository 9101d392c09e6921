#!/usr/bin/python3
"""lowrank against PyTorch's own PowerSGD, per call, on the same gradients.

PyTorch side: the UNMODIFIED powerSGD_hook (and batched_powerSGD_hook) of the installed torch
(Debian's python3-torch; run with /usr/bin/python3), driven directly on a gradient set through a
minimal GradBucket stand-in (buffer, index, gradients, is_last, parameters), so no DDP backward pass
is in the timing; gloo backend, W processes, torch.set_num_threads(1) in each; error feedback and
warm start on, min_compression_rate 2, compression from the first call (state.iter set past
start_powerSGD_iter). Per call: a fresh copy of the gradients (not timed), a barrier, the hook, wait
for its future. Time per call: the median over `rounds` calls, the first call excluded, of the
slowest rank's time. relerr: the first call's output against the exact mean (a gloo allreduce),
||out - mean|| / ||mean||.

lowrank side: lowrank_allreduce_perf -t W --gradients DIR --step STEP -k K on the same files
(comm rank r reads <step>_worker<r mod nfiles>), the same per-tensor layout (a tensor viewed as
(shape[0], prod(rest)), compressed when (n + m) k 2 < n m, as the hook does): the mean time per call
over `rounds` calls after one warm-up (out-of-place), relerr of the first compressed call.
Exact mode is timed too (lowrank exact against a gloo allreduce of the same buffer).

Gradient sets: digits (perf/data/digits_cnn step0040, real), resnet50 (synthetic, 25.6 M),
gpt2 (synthetic, GPT-2 small, 124.4 M), gpt2-blocks (its 12 blocks without the 38.6 M of
embeddings, 85.1 M); synthetic ones have a decaying spectrum (studies/lib/gradsets.py).

usage: /usr/bin/python3 -m studies.compare_pytorch.run [--sets digits,resnet50] [--worlds 2,4] [--ks 1,2,4]
          [--rounds N] [--perf build/perf/lowrank_allreduce_perf] [--out studies/compare_pytorch/results/compare_pytorch]
"""
import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from studies.lib import gradsets, provenance
from studies.lib.launch import ROOT
from studies.lib.ports import free_master_port

HERE = os.path.dirname(os.path.abspath(__file__))

# rounds per set when --rounds is not given (the whole default run stays under ~15 min on 2 cores)
DEFAULT_ROUNDS = {"digits": 10, "resnet50": 5, "gpt2": 3, "gpt2-blocks": 3}
LABELS = {"digits": "digits_cnn step0040 (real, 0.77 M)",
          "resnet50": "ResNet-50 shapes (synthetic, 25.6 M)",
          "gpt2": "GPT-2 small (synthetic, 124.4 M)",
          "gpt2-blocks": "GPT-2 small, 12 blocks without embeddings (synthetic, 85.1 M)"}


class Bucket:
    """The part of torch.distributed.GradBucket the hooks use: one bucket holding every tensor."""

    def __init__(self, buf, shapes):
        self._buf = buf
        self._views, off = [], 0
        for s in shapes:
            n = int(np.prod(s))
            self._views.append(buf[off:off + n].view(s))
            off += n

    def buffer(self): return self._buf
    def index(self): return 0
    def is_last(self): return True
    def gradients(self): return self._views
    def parameters(self): return self._views


def torch_worker(rank, world, files, ks, rounds, port, batched, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tensors = gradsets.read_safetensors(files[rank % len(files)])
    shapes = [tuple(a.shape) for _, a in tensors]
    flat = torch.cat([torch.from_numpy(a).reshape(-1) for _, a in tensors])
    del tensors
    mean = flat.clone()
    dist.all_reduce(mean)
    mean /= world

    def timed(fn):
        """rounds + 1 calls; per call the slowest rank's seconds; median without the first call."""
        ts, out0 = [], None
        for r in range(rounds + 1):
            buf = flat.clone()
            dist.barrier()
            t0 = time.perf_counter()
            out = fn(buf)
            ts.append(time.perf_counter() - t0)
            if r == 0:
                out0 = float((out - mean).norm() / mean.norm())
        tt = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return statistics.median(tt.tolist()[1:]) * 1e3, out0

    def exact(buf):
        dist.all_reduce(buf)
        return buf.div_(world)

    res = {"params": int(flat.numel()), "hook_file": psgd.__file__}
    res["exact"] = timed(exact)
    for k in ks:
        st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=k,
                                start_powerSGD_iter=2, min_compression_rate=2,
                                use_error_feedback=True, warm_start=True, random_seed=0)
        st.iter = st.start_powerSGD_iter  # compress from the first call
        res[f"powerSGD_hook k={k}"] = timed(lambda b: psgd.powerSGD_hook(st, Bucket(b, shapes)).wait())
        if batched:
            sb = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=k,
                                    start_powerSGD_iter=2, min_compression_rate=2,
                                    use_error_feedback=True, warm_start=True, random_seed=0)
            sb.iter = sb.start_powerSGD_iter
            try:
                res[f"batched_powerSGD_hook k={k}"] = timed(
                    lambda b: psgd.batched_powerSGD_hook(sb, Bucket(b, shapes)).wait()[:flat.numel()])
            except Exception as e:  # torch 1.13: AssertionError in _orthogonalize (a 2-D tensor)
                msg = str(e).strip().splitlines()[0][:80] if str(e).strip() else ""
                where = traceback.extract_tb(e.__traceback__)[-1]
                res[f"batched_powerSGD_hook k={k}"] = (
                    f"{type(e).__name__}{': ' + msg if msg else ''} at "
                    f"{os.path.basename(where.filename)}:{where.lineno} `{where.line}`")
                dist.barrier()
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(files, world, ks, rounds, batched):
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_master_port()
    procs = [ctx.Process(target=torch_worker, args=(r, world, files, ks, rounds, port, batched, q))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=1800)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad or q.empty():
        return {"error": f"torch workers failed (exit codes {[p.exitcode for p in procs]})"}
    return q.get()


def run_lowrank(perf, gdir, step, world, k, rounds, modes, phases):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        jpath = f.name
    cmd = [perf, "-t", str(world), "--gradients", gdir, "--step", step, "-k", str(k),
           "--rounds", str(rounds), "-n", str(rounds), "-w", "1", "--mode", ",".join(modes),
           "--phases", "1" if phases else "0", "-J", jpath]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        return cmd, {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}, wall
    d = json.load(open(jpath))
    os.unlink(jpath)
    rows = {}
    for r in d["results"]:
        l = r["lowrank"]
        rows[l["mode"]] = dict(ms=r["out_of_place"]["time"] / 1e3, relerr=l["relerr"],
                               relerr_opt=l.get("relerr_opt"), ratio=l.get("ratio"),
                               compute_ms=(l.get("compute_us") or 0) / 1e3 or None,
                               comm_ms=(l.get("comm_us") or 0) / 1e3 or None,
                               bound_ms=(l.get("bound_us") or 0) / 1e3 or None,
                               compute_eff=l.get("compute_eff"))
    rows["triad_gbps"] = d.get("triad_gbps")
    rows["triad_shared_gbps"] = d.get("triad_shared_gbps")
    return cmd, rows, wall


def fmt(v, f="{:.1f}"):
    return "-" if v is None else (f.format(v) if isinstance(v, (int, float)) else str(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="digits,resnet50,gpt2-blocks",
                    help="comma list of digits, resnet50, gpt2, gpt2-blocks")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed calls per case (default per set: " +
                         ", ".join(f"{k} {v}" for k, v in DEFAULT_ROUNDS.items()) + ")")
    ap.add_argument("--perf", default=os.path.join(ROOT, "build/perf/lowrank_allreduce_perf"))
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "lowrank-gradsets"),
                    help="where synthetic gradient files are written (and reused)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "compare_pytorch"),
                    help="writes OUT.md and OUT.json")
    ap.add_argument("--no-batched", action="store_true", help="skip batched_powerSGD_hook")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact reference rows")
    ap.add_argument("--phases", type=int, default=1,
                    help="1: the perf binary also measures compute_us/comm_us (slower)")
    a = ap.parse_args()
    sets = a.sets.split(",")
    worlds = [int(x) for x in a.worlds.split(",")]
    ks = [int(x) for x in a.ks.split(",")]
    for s in sets:
        if s != "digits" and s not in gradsets.SETS:
            sys.exit(f"unknown set {s}")
    if not os.access(a.perf, os.X_OK):
        sys.exit(f"no perf binary at {a.perf} (ninja -C build)")

    record = provenance.start(ROOT, binary=a.perf)  # the library the perf binary loads
    git = subprocess.run(["git", "-C", ROOT, "log", "--oneline", "-1"], capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    env = {k: v for k, v in os.environ.items() if k.startswith("LOWRANK_")}
    head = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
            f"machine: {platform.node()}, {os.cpu_count()} cores ({cpu})",
            f"lowrank: {git}{' + uncommitted changes' if dirty else ''}; perf {a.perf}; "
            f"LOWRANK_* {env or 'unset'}",
            f"torch {torch.__version__}, hook module: {psgd.__file__}",
            "load average at start: %.2f %.2f %.2f" % os.getloadavg()]
    print("\n".join(head))
    print("torch.__config__.show():")
    print(torch.__config__.show())
    sys.stdout.flush()

    results, table = [], []
    t_start = time.time()
    for s in sets:
        rounds = a.rounds or DEFAULT_ROUNDS[s]
        if s == "digits":
            gdir, step = os.path.join(ROOT, "perf/data/digits_cnn"), "step0040"
        else:
            gdir = os.path.join(a.cache, s)
            t0 = time.time()
            step = gradsets.make_set(s, gdir, workers=max(worlds))
            print(f"# {s}: gradients in {gdir} ({time.time() - t0:.0f} s)", flush=True)
        files = sorted(glob.glob(os.path.join(gdir, f"{step}_worker*.safetensors")))
        for w in worlds:
            t0 = time.time()
            tr = run_torch(files, w, ks, rounds, not a.no_batched)
            print(f"# torch {s} world {w}: {time.time() - t0:.0f} s", flush=True)
            lr_rows = {}
            for i, k in enumerate(ks):
                modes = ["powersgd"] + (["exact"] if i == 0 and not a.no_exact else [])
                cmd, rows, wall = run_lowrank(a.perf, gdir, step, w, k, rounds, modes, a.phases)
                print(f"# {' '.join(cmd)}: {wall:.0f} s", flush=True)
                lr_rows[k] = (cmd, rows)
            def add(kname, tres, lres, note=""):
                tms = tres[0] if isinstance(tres, tuple) else None
                trel = tres[1] if isinstance(tres, tuple) else None
                if isinstance(tres, str):
                    note = tres
                lms = lres.get("ms") if lres else None
                lrel = lres.get("relerr") if lres else None
                if lres and "error" in lres:
                    note = "lowrank: " + lres["error"]
                ratio = tms / lms if tms and lms else None
                table.append([s, w, kname, tms, trel, lms, lrel, ratio, note])
                results.append(dict(set=s, world=w, k=kname, torch_ms=tms, torch_relerr=trel,
                                    lowrank_ms=lms, lowrank_relerr=lrel, speedup=ratio,
                                    note=note, lowrank=lres, rounds=rounds))
            if "error" in tr:
                for k in ks:
                    add(str(k), tr["error"], lr_rows[k][1].get("powersgd"))
                continue
            if not a.no_exact:
                first = lr_rows[ks[0]][1]
                add("exact", tr["exact"], first.get("exact") if "error" not in first else first,
                    "torch: gloo allreduce; lowrank: exact mode")
            for k in ks:
                cmd, rows = lr_rows[k]
                lres = rows.get("powersgd") if "error" not in rows else rows
                note = ""
                if lres and lres.get("compute_ms"):
                    note = (f"lowrank compute {lres['compute_ms']:.1f} ms (bound "
                            f"{fmt(lres.get('bound_ms'))} ms), comm {fmt(lres.get('comm_ms'))} ms; "
                            f"relerr_opt {fmt(lres.get('relerr_opt'), '{:.3f}')}")
                add(str(k), tr[f"powerSGD_hook k={k}"], lres, note)
            if not a.no_batched:
                for k in ks:
                    add(f"{k} (batched_powerSGD_hook)", tr[f"batched_powerSGD_hook k={k}"], None)

    md = ["# lowrank vs PyTorch powerSGD_hook", ""]
    md += [f"- {h}" for h in head]
    md += [f"- rounds per case: " + ", ".join(f"{s} {a.rounds or DEFAULT_ROUNDS[s]}" for s in sets),
           f"- total wall time: {time.time() - t_start:.0f} s; load average at the end: "
           + "%.2f %.2f %.2f" % os.getloadavg() + " (other work on the machine distorts the times)", "",
           "| set | world | k | torch ms/call | torch relerr | lowrank ms/call | lowrank relerr | "
           "speedup (torch/lowrank) | note |",
           "|---|---|---|---|---|---|---|---|---|"]
    for s, w, k, tms, trel, lms, lrel, ratio, note in table:
        md.append(f"| {s} | {w} | {k} | {fmt(tms)} | {fmt(trel, '{:.4f}')} | {fmt(lms)} | "
                  f"{fmt(lrel, '{:.4f}')} | {fmt(ratio, '{:.2f}x')} | {note} |")
    md += ["", "Sets: " + "; ".join(f"{s}: {LABELS[s]}" for s in sets), ""]
    text = "\n".join(md)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".md", "w") as f:
        f.write(text + "\n\n```\n" + torch.__config__.show() + "```\n")
    with open(a.out + ".json", "w") as f:
        json.dump(dict(header=head, provenance=provenance.finish(record), results=results), f, indent=1)
    print(f"# written: {a.out}.md, {a.out}.json")


if __name__ == "__main__":
    main()
