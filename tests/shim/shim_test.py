#!/usr/bin/env python3
"""Tests of the NCCL shim (plugin/nccl_shim) that run without a GPU.

    shim_test.py CASE --shim LIB --app APP --app-direct APP --double-dir DIR --symbols TXT
                 [--dropin-dir DIR] [--version-app APP --real-nccl-dir DIR]

CASE:
  exports    nm -D: liblowrank_nccl.so exports the shim's entry points (and no p-prefixed name,
             which would shadow the real library's), has no undefined NCCL symbol; the drop-in
             libnccl.so.2 (soname libnccl.so.2) exports a superset of the real library's symbols
             (the real /usr/local/cuda one when present, else the committed list)
  real_nccl  the real libnccl.so.2 loads behind the preloaded shim with LD_BIND_NOW=1 (no
             unresolved symbol) and ncclAllReduce is interposed; the drop-in forwards to it
             (LOWRANK_NCCL_LIBRARY), and refuses clearly when the variable is unset or names the
             drop-in itself
  mixed      2 processes of nccl_app (an unmodified NCCL program over the NCCL test double), run
             without the shim, with LD_PRELOAD of it, and as nccl_app_direct (lowrank called
             directly): with the shim every output equals the direct run bit for bit; calls the
             shim passes to NCCL (int32, max, small, one-off, the detection's repetitions) equal
             the run without the shim bit for bit; compressed ones differ from it; every comm rank
             has the same outputs; the report line counts the compressed calls
  mixed3     the same with 3 processes (premulsum 1/3 in half precision maps to avg)
  groups     every call inside ncclGroupStart/End (nested too): compressed calls are deferred to
             the outermost group end (the buffer is untouched when ncclAllReduce returns inside the
             group) and equal the direct run
  change     a changed call sequence releases the state of the buffers it touches: equal to the
             direct run that releases them, and different from one that does not
  destroy    a communicator finalized (then destroyed) and a new one made, later aborted: the
             second starts afresh (outputs equal the first round's bit for bit); one report line
             per communicator ("finalized", "aborted")
  layout     lowrankNcclSetBucketLayout (looked up with dlsym, as from Python's ctypes) switches a
             bucket to per-tensor mode: equal to lowrankBufferSetLayout called directly; its 1-D
             tensor (a bias) is then allreduced exactly, which it is not without the hint; a
             malformed hint returns lowrankInvalidArgument; a stale one (its elements do not
             add up to the call's count) is ignored
  threshold  default LOWRANK_MIN_BYTES (1 MiB): a 1 MiB float32 buffer is compressed, one 4 bytes
             smaller is exact; without ncclCommDestroy the report line comes at exit
  failalloc  LOWRANK_TEST_FAIL_ALLOC=1: comm rank 1 fails its plan allocations, every comm rank
             falls back to exact (outputs equal the run without the shim bit for bit), no hang
  peerdeath  a comm rank dies between two compressed calls (LOWRANK_TIMEOUT=5): the survivor's
             compressed ncclAllReduce fails promptly with an NCCL error and the shim's message
             (the output may be half written: never retried, never silent)
  enable0    LOWRANK_ENABLE=0: outputs equal the run without the shim, the shim says nothing
  dropin     the drop-in libnccl.so.2 (LD_LIBRARY_PATH, LOWRANK_NCCL_LIBRARY=the double): outputs
             equal the preload run bit for bit
  badenv     malformed LOWRANK_MIN_BYTES / LOWRANK_ENABLE: ncclAllReduce fails with
             ncclInvalidUsage and the shim's message names the variable
  warmup     LOWRANK_START_ITER=2 (mixed, change): lowrank applies it to the buffers the shim
             gives it: each buffer's first 2 such calls are exact (equal NCCL's bit for bit, not
             counted as compressed), the later ones compressed; kept over a one-off, started
             again after a release; the report counts them as exact in lowrank

Exit status: 0 pass, 1 fail, 77 skipped (meson's convention).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import testlib  # noqa: E402
from testlib import SKIP, check, log  # noqa: E402


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOWRANK_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    # LOWRANK_UCX_PROBE=0: outputs compared bit for bit across runs never depend on timing
    env.update(LOWRANK_MIN_BYTES="65536", LOWRANK_TIMEOUT="30", LOWRANK_DEBUG="INFO",
               LOWRANK_UCX_PROBE="0")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


class Run:
    """One multi-process run of an app: outputs per comm rank, stderr per comm rank."""

    def __init__(self, outs, errs, rcs):
        self.outs, self.errs, self.rcs = outs, errs, rcs


def launch(args, app, scenario, nranks, tmp, name, env, extra=(), timeout=120):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    idfile = os.path.join(d, "id")
    procs = [testlib.start([app, scenario, str(r), str(nranks), idfile, os.path.join(d, f"out{r}")]
                           + list(extra), env) for r in range(nranks)]
    errs, rcs = [], []
    for rc, o, e in testlib.finish(procs, timeout):
        if rc == "HUNG":
            rc, e = None, e + f"\n[killed after {timeout} s: hang]"
        errs.append(o + e)
        rcs.append(rc)
    outs = [read_outputs(os.path.join(d, f"out{r}")) for r in range(nranks)]
    for r in range(nranks):
        if rcs[r] != 0:
            log(f"--- {name} comm rank {r} exited {rcs[r]}; its output (tail):")
            log("\n".join(errs[r].splitlines()[-25:]))
    return Run(outs, errs, rcs)


# Where the schedule sends a call (nccl_app.c: "out ITER TAG KIND ...").
NCCL, COMPRESSED, WARMUP = 0, 1, 2  # WARMUP: given to lowrank, done exactly (LOWRANK_START_ITER)


def read_outputs(prefix):
    """{(iter, tag): (kind, bytes)}, [(iter, tag, unchanged)] and the hint results."""
    outs, deferred, hint = {}, [], None
    try:
        data = open(prefix + ".bin", "rb").read()
        for line in open(prefix + ".txt"):
            f = line.split()
            if f[0] == "out":
                it, tag, comp, off, n = int(f[1]), f[2], int(f[3]), int(f[4]), int(f[5])
                outs[(it, tag)] = (comp, data[off:off + n])
            elif f[0] == "deferred":
                deferred.append((int(f[1]), f[2], int(f[3])))
            elif f[0] == "hint":
                hint = (int(f[1]), int(f[2]))
    except FileNotFoundError:
        pass
    return {"outs": outs, "deferred": deferred, "hint": hint}


def preload_env(args, **extra):
    return base_env(LD_PRELOAD=args.shim, **extra)


def report_lines(err):
    return re.findall(r"LOWRANK INFO NCCL shim: comm \S+ \(comm rank (\d+) of (\d+), device -?\d+\) "
                      r"(\w+(?: \w+)?): (\d+) calls compressed, (\d+) exact in lowrank, (\d+) passed "
                      r"through to NCCL, (-?\d+) bytes saved", err)


def ok_run(run, name):
    return check(all(rc == 0 for rc in run.rcs) and all(o["outs"] for o in run.outs),
                 f"{name}: every process exits 0 with its outputs")


def same_everywhere(run, name):
    base = run.outs[0]["outs"]
    for r, o in enumerate(run.outs[1:], 1):
        if {k: v[1] for k, v in o["outs"].items()} != {k: v[1] for k, v in base.items()}:
            return check(False, f"{name}: comm rank {r}'s outputs equal comm rank 0's")
    return check(True, f"{name}: every comm rank has the same outputs ({len(base)} calls)")


def compare(a, b, keys=None):
    """Keys of a whose bytes differ in b (or are missing)."""
    ka = a["outs"]
    kb = b["outs"]
    return [k for k in (keys if keys is not None else ka) if k not in kb or ka[k][1] != kb[k][1]]


def check_against(shim, exact, direct, name, nranks):
    """The core assertions: shim == direct everywhere; uncompressed (NCCL's, lowrank's warm-up)
    == exact; compressed != exact."""
    for r in range(nranks):
        s, e, d = shim.outs[r], exact.outs[r], direct.outs[r]
        sched = s["outs"]
        comp = [k for k, v in sched.items() if v[0] == COMPRESSED]
        plain = [k for k, v in sched.items() if v[0] == NCCL]
        warm = [k for k, v in sched.items() if v[0] == WARMUP]
        check(bool(comp) and bool(plain), f"{name} rank {r}: the schedule has {len(comp)} compressed "
              f"calls, {len(warm)} exact in lowrank and {len(plain)} passed to NCCL")
        diff = compare(s, d)
        check(not diff, f"{name} rank {r}: every output equals lowrank called directly, bit for bit"
              + (f" (differ: {sorted(diff)[:6]})" if diff else ""))
        diff = compare(s, e, plain)
        check(not diff, f"{name} rank {r}: the {len(plain)} calls passed to NCCL (ineligible, "
              "one-off, detection) equal NCCL without the shim, bit for bit"
              + (f" (differ: {sorted(diff)[:6]})" if diff else ""))
        if warm:
            diff = compare(s, e, warm)
            check(not diff, f"{name} rank {r}: the {len(warm)} calls lowrank did exactly (warm-up) "
                  "equal NCCL without the shim, bit for bit"
                  + (f" (differ: {sorted(diff)[:6]})" if diff else ""))
        same = [k for k in comp if k in e["outs"] and e["outs"][k][1] == sched[k][1]]
        check(not same, f"{name} rank {r}: the {len(comp)} compressed calls differ from the exact "
              "allreduce" + (f" (equal: {sorted(same)[:6]})" if same else ""))
    same_everywhere(shim, name)


def check_reports(run, name, nranks, compressed, passed, when="destroyed", count=1, exact=None):
    for r in range(nranks):
        lines = [l for l in report_lines(run.errs[r]) if l[2] == when]
        check(len(lines) == count, f"{name} rank {r}: {count} report line(s) '{when}' "
              f"(found {len(lines)})")
        if not lines:
            continue
        rank, n, _, comp, exact_, through, saved = lines[-1]
        check(int(rank) == r and int(n) == nranks, f"{name} rank {r}: the report names comm rank "
              f"{rank} of {n}")
        if compressed is not None:
            check(int(comp) == compressed, f"{name} rank {r}: {comp} calls compressed "
                  f"(schedule: {compressed})")
        if passed is not None:
            check(int(through) == passed, f"{name} rank {r}: {through} calls passed through "
                  f"(schedule: {passed})")
        if exact is not None:
            check(int(exact_) == exact, f"{name} rank {r}: {exact_} calls exact in lowrank "
                  f"(schedule: {exact})")
        if compressed:
            check(int(saved) > 0, f"{name} rank {r}: {saved} bytes saved > 0")


def schedule_counts(run):
    """Calls compressed, exact in lowrank (warm-up) and passed to NCCL, as the schedule says."""
    kinds = [v[0] for v in run.outs[0]["outs"].values()]
    return kinds.count(COMPRESSED), kinds.count(WARMUP), kinds.count(NCCL)


# ---- cases ---------------------------------------------------------------------------------------

def nm_defined(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    return {l.split()[-1] for l in out.splitlines() if l.strip()}


def nm_undefined(lib):
    out = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    return {l.split()[-1] for l in out.splitlines() if l.strip()}


def case_exports(args, tmp):
    if not shutil.which("nm"):
        return SKIP
    entry = {"ncclAllReduce", "ncclGroupStart", "ncclGroupEnd", "ncclCommDestroy", "ncclCommAbort",
             "ncclCommFinalize", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy"}
    shim = nm_defined(args.shim)
    check(entry <= shim, f"liblowrank_nccl.so exports {sorted(entry)}: missing {sorted(entry - shim)}")
    check("lowrankNcclSetBucketLayout" in shim, "liblowrank_nccl.so exports lowrankNcclSetBucketLayout")
    # The mark by which liblowrank never takes a lowrank shim for the real NCCL (platform/nccl.h).
    check("lowrankNcclShimMarker" in shim, "liblowrank_nccl.so exports lowrankNcclShimMarker")
    pn = sorted(s for s in shim if s.startswith("pnccl"))
    check(not pn, f"liblowrank_nccl.so exports no pncclX (the real library's own entries): {pn}")
    others = sorted(s for s in shim if not (s.startswith("nccl") or
                                            s in ("lowrankNcclSetBucketLayout", "lowrankNcclShimMarker")))
    check(not others, f"liblowrank_nccl.so exports nothing else (lowrank's internals stay local): "
          f"{others[:8]}")
    und = sorted(s for s in nm_undefined(args.shim) if re.match(r"p?nccl", s))
    check(not und, f"liblowrank_nccl.so has no undefined NCCL symbol (it resolves them at run "
          f"time): {und}")
    if not args.dropin_dir:
        log("  (no drop-in on this architecture)")
        return 0
    dropin = os.path.join(args.dropin_dir, "libnccl.so.2")
    listed = {l.split("#")[0].strip() for l in open(args.symbols)} - {""}
    real_lib = os.path.join(args.real_nccl_dir, "libnccl.so.2") if args.real_nccl_dir else ""
    real = nm_defined(real_lib) if real_lib and os.path.exists(real_lib) else listed
    d = nm_defined(dropin)
    check(real <= d, f"the drop-in exports every symbol of {real_lib or 'nccl_symbols.txt'} "
          f"({len(real)}): missing {sorted(real - d)[:10]}")
    check(listed <= d, f"the drop-in exports every symbol of nccl_symbols.txt ({len(listed)})")
    check(entry <= d and "lowrankNcclSetBucketLayout" in d, "the drop-in exports the shim's entry points")
    soname = subprocess.run(["readelf", "-d", dropin], capture_output=True, text=True).stdout
    check("Library soname: [libnccl.so.2]" in soname, "the drop-in's soname is libnccl.so.2")
    und = sorted(s for s in nm_undefined(dropin) if re.match(r"p?nccl", s))
    check(not und, f"the drop-in has no undefined NCCL symbol: {und}")
    return 0


def case_real_nccl(args, tmp):
    if not args.version_app:
        log("no real libnccl.so.2 in the toolkit: skipped")
        return SKIP
    env = base_env(LD_LIBRARY_PATH=args.real_nccl_dir, LD_BIND_NOW="1", LOWRANK_DEBUG=None)
    plain = subprocess.run([args.version_app], env=env, capture_output=True, text=True)
    m = re.search(r"version (\d+) bound-allreduce-is-real (\d)", plain.stdout)
    check(plain.returncode == 0 and m and m.group(2) == "1",
          f"without the shim the program runs on the real NCCL: {plain.stdout.strip()}")
    version = m.group(1) if m else "?"
    pre = subprocess.run([args.version_app], env=dict(env, LD_PRELOAD=args.shim),
                         capture_output=True, text=True)
    m = re.search(r"version (\d+) bound-allreduce-is-real (\d)", pre.stdout)
    check(pre.returncode == 0 and m and m.group(1) == version,
          f"LD_PRELOAD=liblowrank_nccl.so LD_BIND_NOW=1: the real NCCL {version} loads and answers "
          f"(rc {pre.returncode}: {pre.stdout.strip()} {pre.stderr.strip()[-300:]})")
    check(m is not None and m.group(2) == "0", "ncclAllReduce is bound to the shim, not the real one")
    if not args.dropin_dir:
        return 0
    real = os.path.join(args.real_nccl_dir, "libnccl.so.2")
    denv = dict(env, LD_LIBRARY_PATH=args.dropin_dir, LOWRANK_NCCL_LIBRARY=real)
    drop = subprocess.run([args.version_app], env=denv, capture_output=True, text=True)
    m = re.search(r"version (\d+) .* error-string (.*)", drop.stdout)
    check(drop.returncode == 0 and m and m.group(1) == version,
          f"drop-in, LOWRANK_NCCL_LIBRARY=the real one: ncclGetVersion forwarded ({drop.stdout.strip()} "
          f"{drop.stderr.strip()[-300:]})")
    check(m is not None and "invalid usage" in m.group(2),
          "drop-in: ncclGetErrorString forwarded (returns a pointer)")
    unset = subprocess.run([args.version_app], capture_output=True, text=True,
                           env={k: v for k, v in denv.items() if k != "LOWRANK_NCCL_LIBRARY"})
    check(unset.returncode != 0 and "LOWRANK_NCCL_LIBRARY is not set" in unset.stderr,
          f"drop-in without LOWRANK_NCCL_LIBRARY: a clear error (rc {unset.returncode}: "
          f"{unset.stderr.strip()[-200:]})")
    self_ = subprocess.run([args.version_app], capture_output=True, text=True,
                           env=dict(denv, LOWRANK_NCCL_LIBRARY=os.path.join(args.dropin_dir, "libnccl.so.2")))
    check(self_.returncode != 0 and "is the lowrank shim itself" in self_.stderr,
          f"drop-in with LOWRANK_NCCL_LIBRARY naming itself: a clear error ({self_.stderr.strip()[-200:]})")
    bad = subprocess.run([args.version_app], capture_output=True, text=True,
                         env=dict(denv, LOWRANK_NCCL_LIBRARY="/nonexistent/libnccl.so.2"))
    check(bad.returncode != 0 and "cannot load LOWRANK_NCCL_LIBRARY=/nonexistent" in bad.stderr,
          "drop-in with a LOWRANK_NCCL_LIBRARY that cannot be loaded: a clear error")
    return 0


def three_runs(args, tmp, scenario, nranks, extra=(), **env):
    exact = launch(args, args.app, scenario, nranks, tmp, scenario + "_exact", base_env(**env),
                   extra)
    shim = launch(args, args.app, scenario, nranks, tmp, scenario + "_shim",
                  preload_env(args, **env), extra)
    direct = launch(args, args.app_direct, scenario, nranks, tmp, scenario + "_direct",
                    base_env(**env), extra)
    good = ok_run(exact, f"{scenario} without the shim") & ok_run(shim, f"{scenario} with the shim") \
        & ok_run(direct, f"{scenario} lowrank direct")
    return exact, shim, direct, good


def case_mixed(args, tmp, nranks=2):
    exact, shim, direct, good = three_runs(args, tmp, "mixed", nranks)
    if not good:
        return 0
    check_against(shim, exact, direct, "mixed", nranks)
    comp, warm, plain = schedule_counts(shim)
    check_reports(shim, "mixed", nranks, comp, plain, exact=warm)
    for r in range(nranks):
        check("NCCL shim" not in exact.errs[r], f"mixed rank {r}: no shim line without the preload")
    return 0


def case_groups(args, tmp):
    exact, shim, direct, good = three_runs(args, tmp, "groups", 2)
    if not good:
        return 0
    check_against(shim, exact, direct, "groups", 2)
    for r in range(2):
        sched = shim.outs[r]["outs"]
        d = shim.outs[r]["deferred"]
        wrong = [(it, tag, u) for it, tag, u in d if u != (sched[(it, tag)][0] != NCCL)]
        check(d and not wrong, f"groups rank {r}: inside a group, exactly the calls given to "
              f"lowrank are deferred to the group's end ({len(d)} calls; wrong: {wrong[:4]})")
        ex = exact.outs[r]["deferred"]
        check(ex and not any(u for _, _, u in ex), f"groups rank {r}: without the shim nothing is "
              "deferred (the double runs calls at once: the check can tell)")
    comp, warm, plain = schedule_counts(shim)
    check_reports(shim, "groups", 2, comp, plain, exact=warm)
    return 0


def case_change(args, tmp):
    exact, shim, direct, good = three_runs(args, tmp, "change", 2)
    kept = launch(args, args.app_direct, "change", 2, tmp, "direct_norelease", base_env(),
                  ["--no-release"])
    if not (good and ok_run(kept, "change lowrank direct, state kept")):
        return 0
    check_against(shim, exact, direct, "change", 2)
    for r in range(2):
        diff = compare(shim.outs[r], kept.outs[r])
        check(diff and all(it >= 7 for it, _ in diff), f"change rank {r}: without the release the "
              f"results differ from iteration 7 on ({sorted(diff)[:4]}): the shim did release")
        check("given to lowrank from now on (2 buffers' state released)" in shim.errs[r],
              f"change rank {r}: the log says 2 buffers' state released")
    comp, warm, plain = schedule_counts(shim)
    check_reports(shim, "change", 2, comp, plain, exact=warm)
    return 0


def case_destroy(args, tmp):
    exact, shim, direct, good = three_runs(args, tmp, "destroy", 2)
    if not good:
        return 0
    check_against(shim, exact, direct, "destroy", 2)
    for r in range(2):
        o = shim.outs[r]["outs"]
        first = {(it, tag): v for (it, tag), v in o.items() if it < 10}
        again = [k for k in first if (k[0] + 10, k[1]) not in o or o[(k[0] + 10, k[1])][1] != first[k][1]]
        check(first and not again, f"destroy rank {r}: the new communicator starts afresh (detection, "
              f"new state): its {len(first)} outputs equal the first round's ({again[:4]})")
    check_reports(shim, "destroy", 2, 4, 4, when="finalized")
    check_reports(shim, "destroy", 2, 4, 4, when="aborted")
    for r in range(2):
        check(not [l for l in report_lines(shim.errs[r]) if l[2] != "finalized" and l[2] != "aborted"],
              f"destroy rank {r}: no other report line (the finalized comm's destroy adds none)")
    return 0


def case_threshold(args, tmp):
    env = base_env(LOWRANK_MIN_BYTES=None)
    exact = launch(args, args.app, "threshold", 2, tmp, "exact", env)
    shim = launch(args, args.app, "threshold", 2, tmp, "shim", dict(env, LD_PRELOAD=args.shim))
    direct = launch(args, args.app_direct, "threshold", 2, tmp, "direct", env)
    if not (ok_run(exact, "threshold exact") & ok_run(shim, "threshold shim") & ok_run(direct, "direct")):
        return 0
    check("LOWRANK_MIN_BYTES 1048576" in shim.errs[0], "the default LOWRANK_MIN_BYTES is 1 MiB")
    check_against(shim, exact, direct, "threshold", 2)
    check_reports(shim, "threshold", 2, 2, 6)
    # A program that never destroys its communicator gets the report line at exit.
    kept = launch(args, args.app, "threshold", 2, tmp, "nodestroy", dict(env, LD_PRELOAD=args.shim),
                  ["--no-destroy"])
    if ok_run(kept, "threshold shim, communicator never destroyed"):
        check_reports(kept, "threshold", 2, 2, 6, when="at exit")
    return 0


def case_layout(args, tmp):
    exact, shim, direct, good = three_runs(args, tmp, "layout", 2)
    batched = launch(args, args.app, "layout", 2, tmp, "nohint", preload_env(args), ["--no-hint"])
    if not (good and ok_run(batched, "layout with the shim, no hint")):
        return 0
    check_against(shim, exact, direct, "layout", 2)
    bias = slice(128 * 96 * 4, (128 * 96 + 96) * 4)  # the 1-D tensor's bytes in L1
    for r in range(2):
        check(shim.outs[r]["hint"] == (0, 4), f"layout rank {r}: the hint returns lowrankSuccess, a "
              f"malformed one lowrankInvalidArgument ({shim.outs[r]['hint']})")
        s, e, b = shim.outs[r]["outs"], exact.outs[r]["outs"], batched.outs[r]["outs"]
        comp = [k for k, v in s.items() if v[0] == COMPRESSED and k[1] == "L1"]
        check(comp and all(s[k][1][bias] == e[k][1][bias] for k in comp),
              f"layout rank {r}: per-tensor mode: the bias of every compressed call is exact")
        check(any(b[k][1][bias] != e[k][1][bias] for k in comp),
              f"layout rank {r}: without the hint (batched) the bias is approximated")
        check("layout of buffer" in shim.errs[r] and "per-tensor" in shim.errs[r],
              f"layout rank {r}: the log tells the layout and lowrank plans the buffer per tensor")
        check("has 16480 elements, the call 20000: ignored" in shim.errs[r],
              f"layout rank {r}: a stale hint (L2: elements do not add up) is ignored and said so")
    return 0


def case_failalloc(args, tmp):
    extra = ["--no-premul"]  # premulsum rounds differently from avg: keep the comparison bitwise
    exact = launch(args, args.app, "mixed", 2, tmp, "exact", base_env(), extra)
    shim = launch(args, args.app, "mixed", 2, tmp, "shim", preload_env(args, LOWRANK_TEST_FAIL_ALLOC=1),
                  extra, timeout=90)
    if not (ok_run(exact, "failalloc exact") & ok_run(shim, "failalloc shim, comm rank 1 cannot allocate")):
        return 0
    for r in range(2):
        diff = compare(shim.outs[r], exact.outs[r])
        check(not diff, f"failalloc rank {r}: every output equals NCCL without the shim, bit for bit "
              f"({sorted(diff)[:6]})")
    same_everywhere(shim, "failalloc")
    comp, warm, plain = schedule_counts(shim)
    for r in range(2):
        lines = [l for l in report_lines(shim.errs[r]) if l[2] == "destroyed"]
        check(lines and int(lines[-1][3]) == 0 and int(lines[-1][4]) == comp + warm and
              int(lines[-1][5]) == plain,
              f"failalloc rank {r}: 0 calls compressed, {comp + warm} exact in lowrank, {plain} "
              f"passed through ({lines[-1][3:6] if lines else 'no report'})")
    check("another comm rank could not allocate" in shim.errs[0] or
          "could not allocate" in shim.errs[0], "comm rank 0 is told that another comm rank could "
          "not allocate")
    return 0


def case_peerdeath(args, tmp):
    run = launch(args, args.app, "mixed", 2, tmp, "peerdeath",
                 preload_env(args, LOWRANK_TIMEOUT=5, LOWRANK_DEBUG="WARN"), ["--exit-at", "3"],
                 timeout=60)
    check(run.rcs[1] == 3, f"comm rank 1 died at iteration 3 as told (rc {run.rcs[1]})")
    e = run.errs[0]
    check(run.rcs[0] == 1 and "hang" not in e, f"comm rank 0 stopped with an error, no hang "
          f"(rc {run.rcs[0]})")
    check(re.search(r"LOWRANK WARN NCCL shim: comm \S+ \(comm rank 0 of 2\): compressed allreduce of "
                    r"buffer .* failed in lowrankAllReduce \(lowrank result \d+\): .*not retried", e) is not None,
          "the shim says which compressed allreduce failed, why, and that it is not retried")
    m = re.search(r"nccl_app rank 0: ncclAllReduce\(.*failed: .*\((\d+)\): (.*)", e)
    check(m is not None and int(m.group(1)) in (2, 3, 6),
          f"the program's ncclAllReduce returned an NCCL error ({m.group(1) if m else 'none'})")
    check(m is not None and re.match(r"lowrank NCCL shim: comm \S+ \(comm rank 0 of 2\): "
                                     r"compressed allreduce of buffer .* failed", m.group(2)),
          f"ncclGetLastError returns the shim's message ({m.group(2)[:120] if m else 'none'})")
    m2 = re.search(r"nccl_app rank 0: after a failed ncclCommCount: (.*) \(before: (.*)\)", e)
    check(m2 is not None and m2.group(1).startswith("ncclCommCount: comm is NULL") and
          m2.group(2).startswith("lowrank NCCL shim: comm"),
          "after a failure in a call the shim does not see, ncclGetLastError returns NCCL's own text, "
          f"and the shim's earlier pointer still reads ({m2.group(0)[:160] if m2 else 'none'})")
    got = run.outs[0]["outs"]
    check(all(it < 3 for it, _ in got), "no output of the failed iteration was recorded as a result")
    return 0


def case_enable0(args, tmp):
    exact = launch(args, args.app, "mixed", 2, tmp, "exact", base_env())
    off = launch(args, args.app, "mixed", 2, tmp, "off", preload_env(args, LOWRANK_ENABLE=0))
    if not (ok_run(exact, "enable0 exact") & ok_run(off, "enable0 shim with LOWRANK_ENABLE=0")):
        return 0
    for r in range(2):
        diff = compare(off.outs[r], exact.outs[r])
        check(not diff and len(off.outs[r]["outs"]) == len(exact.outs[r]["outs"]),
              f"enable0 rank {r}: every output equals NCCL without the shim, bit for bit")
        check(not report_lines(off.errs[r]) and "lowrank communicator made" not in off.errs[r],
              f"enable0 rank {r}: no lowrank communicator, no report line")
    return 0


def case_dropin(args, tmp):
    if not args.dropin_dir:
        return SKIP
    double = os.path.join(args.double_dir, "libnccl.so.2")
    shim = launch(args, args.app, "mixed", 2, tmp, "shim", preload_env(args))
    env = base_env(LD_LIBRARY_PATH=args.dropin_dir, LOWRANK_NCCL_LIBRARY=double)
    drop = launch(args, args.app, "mixed", 2, tmp, "dropin", env)
    if not (ok_run(shim, "preload") & ok_run(drop, "drop-in")):
        return 0
    for r in range(2):
        check("drop-in libnccl.so.2: real NCCL " + double in drop.errs[r],
              f"dropin rank {r}: the drop-in loaded the double from LOWRANK_NCCL_LIBRARY")
        diff = compare(drop.outs[r], shim.outs[r])
        check(not diff and len(drop.outs[r]["outs"]) == len(shim.outs[r]["outs"]),
              f"dropin rank {r}: every output equals the preload run bit for bit ({sorted(diff)[:6]})")
    comp, warm, plain = schedule_counts(drop)
    check_reports(drop, "dropin", 2, comp, plain, exact=warm)
    unset = launch(args, args.app, "mixed", 1, tmp, "dropin_unset",
                   base_env(LD_LIBRARY_PATH=args.dropin_dir), timeout=30)
    check(unset.rcs[0] != 0 and "LOWRANK_NCCL_LIBRARY is not set" in unset.errs[0],
          "drop-in without LOWRANK_NCCL_LIBRARY: the program stops with a message naming it")
    return 0


def lowrank_kinds(sched, tag):
    """The kinds of the calls of buffer `tag` that the schedule gives lowrank, by iteration."""
    return [(it, v[0]) for (it, t), v in sorted(sched.items()) if t == tag and v[0] != NCCL]


def case_warmup(args, tmp):
    n = 2  # LOWRANK_START_ITER
    # mixed: G1 G2 go to lowrank at iterations 2-4, then 7-8 after a one-off (--no-premul: G3's
    # premulsum rounds otherwise than lowrank's avg, so its exact calls would not be bitwise equal).
    # change: G1 G2, then G1 G4; G1 is released at iteration 7.
    for scenario, extra in (("mixed", ["--no-premul"]), ("change", [])):
        exact, shim, direct, good = three_runs(args, tmp, scenario, 2, extra, LOWRANK_START_ITER=n)
        if not good:
            continue
        name = f"warmup {scenario}"
        check_against(shim, exact, direct, name, 2)
        comp, warm, plain = schedule_counts(shim)
        check(comp > 0 and warm > 0, f"{name}: the schedule has {warm} warm-up calls in lowrank "
              f"and {comp} compressed")
        for r in range(2):
            made = rf"comm rank {r}/2: approxRank \d+, minCompressionRate \S+, startIter {n},"
            check(re.search(made, shim.errs[r]) is not None,
                  f"{name} rank {r}: the shim's lowrank communicator has startIter {n}")
        sched = shim.outs[0]["outs"]
        if scenario == "mixed":
            for tag in ("G1", "G2"):
                k = lowrank_kinds(sched, tag)
                want = [WARMUP] * n + [COMPRESSED] * (len(k) - n)
                check(len(k) > n and [x for _, x in k] == want,
                      f"{name} {tag}: its first {n} calls in lowrank are exact, the later ones "
                      f"compressed, after the one-off too (state kept): {k}")
        else:
            k = lowrank_kinds(sched, "G1")
            after = [x for it, x in k if it >= 7]
            check(after[:n] == [WARMUP] * n and COMPRESSED in after,
                  f"{name} G1: released at iteration 7, it warms up again in lowrank: {k}")
        check_reports(shim, name, 2, comp, plain, exact=warm)
    return 0


def case_badenv(args, tmp):
    # (A bad LOWRANK_START_ITER already fails ncclCommInitRank of the double: not the shim's.)
    for i, (var, value) in enumerate([("LOWRANK_MIN_BYTES", "1MiB"), ("LOWRANK_MIN_BYTES", "-5"),
                                      ("LOWRANK_ENABLE", "maybe")]):
        run = launch(args, args.app, "mixed", 2, tmp, f"bad{i}", preload_env(args, **{var: value}),
                     timeout=60)
        for r in range(2):
            e = run.errs[r]
            check(run.rcs[r] == 1 and re.search(r"ncclAllReduce\(.*failed: .*\(5\)", e) and
                  re.search(f'NCCL shim: .*{var}="{re.escape(value)}"', e),
                  f"{var}={value}: comm rank {r}'s ncclAllReduce fails (invalid usage) and the shim's "
                  f"message names the variable")
            check(re.search(r"ncclAllReduce\(.*failed: .*\(5\): lowrank NCCL shim: .*"
                            f'{var}="{re.escape(value)}"', e) is not None,
                  f"{var}={value}: comm rank {r}: ncclGetLastError returns the shim's message")
    return 0


CASES = {"exports": case_exports, "real_nccl": case_real_nccl, "mixed": case_mixed,
         "mixed3": lambda a, t: case_mixed(a, t, 3), "groups": case_groups, "change": case_change,
         "destroy": case_destroy, "threshold": case_threshold, "layout": case_layout, "failalloc": case_failalloc,
         "peerdeath": case_peerdeath, "enable0": case_enable0, "dropin": case_dropin,
         "badenv": case_badenv, "warmup": case_warmup}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--shim", required=True)
    ap.add_argument("--app", required=True)
    ap.add_argument("--app-direct", required=True)
    ap.add_argument("--double-dir", required=True)
    ap.add_argument("--symbols", required=True)
    ap.add_argument("--dropin-dir", default="")
    ap.add_argument("--version-app", default="")
    ap.add_argument("--real-nccl-dir", default="")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shim_test_")
    try:
        log(f"case {args.case}")
        rc = CASES[args.case](args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    if rc == SKIP:
        return SKIP
    return testlib.verdict()

if __name__ == "__main__":
    sys.exit(main())
