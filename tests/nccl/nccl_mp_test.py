#!/usr/bin/env python3
"""Multi-process tests of lowrankCommInitFromNccl over the NCCL test double.

    nccl_mp_test.py CASE --worker PATH [--lowrank-lib PATH] [--double-lib PATH]

CASE:
  compare   2 and 3 processes (unique ids shared through a file that comm rank 0 writes): each
            process checks that lowrank over NCCL gives its outputs over UCX bit for bit (pipelined
            and not), with compressed calls, through pncclAllReduce only; the driver checks every
            comm rank got the same outputs. LOWRANK_APPROX_RANK=1 in the environment must change
            nothing (the config sets k; the double sets its own k = 0).
  library   LOWRANK_NCCL_LIBRARY: a missing file -> lowrankSystemError naming it and the variable;
            a library without NCCL's symbols -> lowrankSystemError naming the symbol; the double's
            own path -> success.

The double is found at run time through LD_LIBRARY_PATH (set by meson).
Exit status: 0 pass, 1 fail.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import testlib  # noqa: E402
from testlib import check, log  # noqa: E402


def base_env(**extra):
    env = dict(os.environ)
    for k in ("LOWRANK_NCCL_LIBRARY", "LOWRANK_APPROX_RANK", "LOWRANK_PIPELINE_CHUNK", "LOWRANK_TIMEOUT"):
        env.pop(k, None)
    env["LOWRANK_TIMEOUT"] = "30"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def case_compare(args, tmp):
    for n in (2, 3):
        idfile = os.path.join(tmp, f"ids{n}")
        prefix = os.path.join(tmp, f"out{n}")
        env = base_env(LOWRANK_APPROX_RANK=1, LOWRANK_PIPELINE_CHUNK=4096)
        t0 = time.monotonic()
        # The root last, so that the others really wait for the id file.
        order = list(range(1, n)) + [0]
        done = testlib.finish([testlib.start([args.worker, "compare", str(r), str(n), idfile, prefix],
                                             env) for r in order], 120)
        res = dict(zip(order, done))
        ok = check(all(res[r][0] == 0 for r in range(n)),
                   f"n={n}: every process matched UCX bit for bit, through pncclAllReduce "
                   f"({time.monotonic() - t0:.1f} s)")
        for r in range(n):
            if not ok:
                testlib.show(f"comm rank {r}", *res[r])
            check(res[r][1].count("MATCH") == 2, f"n={n}: comm rank {r} compared pipeline 0 and 1")
        if not ok:
            continue
        outs = [open(f"{prefix}.{r}", "rb").read() for r in range(n)]
        check(len(outs[0]) > 0 and all(o == outs[0] for o in outs),
              f"n={n}: outputs over NCCL identical on every comm rank ({len(outs[0])} bytes)")


def init_result(args, extra):
    p = subprocess.run([args.worker, "init"], env=base_env(**extra), capture_output=True, text=True,
                       timeout=60)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            code, _, msg = line[len("RESULT "):].partition(": ")
            return int(code), msg
    return None, f"rc={p.returncode} out={p.stdout!r} err={p.stderr[-400:]!r}"


def expect_init(args, extra, code, needles, label):
    got, msg = init_result(args, extra)
    if not check(got == code and all(s in msg for s in needles), f"{label}: result {code} naming {needles}"):
        log(f"    got {got}: {msg}")


def case_library(args, tmp):
    missing = os.path.join(tmp, "no-such-dir", "libnccl.so.2")
    expect_init(args, dict(LOWRANK_NCCL_LIBRARY=missing), 2, [missing, "LOWRANK_NCCL_LIBRARY"],
                "LOWRANK_NCCL_LIBRARY names a missing file")
    if args.lowrank_lib:
        expect_init(args, dict(LOWRANK_NCCL_LIBRARY=args.lowrank_lib), 2,
                    [args.lowrank_lib, "no symbol ncclAllReduce"],
                    "LOWRANK_NCCL_LIBRARY names a library without NCCL's symbols")
    if args.double_lib:
        expect_init(args, dict(LOWRANK_NCCL_LIBRARY=args.double_lib), 0, ["comm rank 0 of 1"],
                    "LOWRANK_NCCL_LIBRARY names the double")
    expect_init(args, {}, 0, ["comm rank 0 of 1"], "libnccl.so.2 by default")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["compare", "library"])
    ap.add_argument("--worker", required=True)
    ap.add_argument("--lowrank-lib")
    ap.add_argument("--double-lib")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lowrank_nccl_") as tmp:
        {"compare": case_compare, "library": case_library}[args.case](args, tmp)
    return testlib.verdict()


if __name__ == "__main__":
    sys.exit(main())
