"""What the Python test drivers share (tests/multiprocess, tests/nccl, tests/shim): checks that
are counted, and processes run side by side under one deadline.

    import testlib
    from testlib import check, log
    ...
    sys.exit(testlib.verdict())

A driver's exit status is meson's: 0 pass, 1 a check failed, 77 (SKIP) skipped.
"""
import subprocess
import time

SKIP = 77
failures = []


def log(msg):
    print(msg, flush=True)


def check(cond, msg):
    """Logs the check; a false one is counted as a failure. Returns cond."""
    log(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        failures.append(msg)
    return cond


def start(cmd, env, prefix_cmd=()):
    return subprocess.Popen(list(prefix_cmd) + list(cmd), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(procs, timeout):
    """Waits for every process under one deadline, killing what is left at it; returns
    [(rc, out, err)], rc "HUNG" for a process that was killed."""
    deadline = time.monotonic() + timeout
    res = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            res.append((p.returncode, out, err))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            res.append(("HUNG", out, err))
    return res


def show(label, rc, out, err, lines=10):
    """The tail of one process's output, for a failed check."""
    log(f"    [{label}] rc={rc}")
    for line in (out.strip().splitlines() + err.strip().splitlines())[-lines:]:
        log("      " + line)


def verdict():
    """Prints the outcome; returns the exit status (1 if any check failed)."""
    if failures:
        log(f"{len(failures)} check(s) failed:")
        for f in failures:
            log("  - " + f)
        return 1
    log("all checks passed")
    return 0
