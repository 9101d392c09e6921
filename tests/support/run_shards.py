#!/usr/bin/env python3
"""Runs a GoogleTest binary as N shards at once (GoogleTest's GTEST_TOTAL_SHARDS and
GTEST_SHARD_INDEX), for a suite whose cases each run on one core (the emulated device engine: the
emulation is one thread), so that a 2-core machine runs it in about half the time.

    run_shards.py N REPORT BINARY [ARGS...]

Shard 0 writes straight to this process's output (a hang shows its case in the test log); the
others' output is printed after each ends, under a heading. On SIGTERM or SIGINT (meson's timeout)
the shards are killed and what they printed so far is shown. REPORT: the JUnit XML of all shards'
cases together (what scripts/count_tests.py counts; its folder is made if missing), or "-" for none;
ARGS must not hold a --gtest_output (each shard writes its own). Exits with the first nonzero status
of a shard (a shard killed by a signal: 128 + the signal), else 0. A GTEST_FILTER in the environment
applies to every shard; each case runs in exactly one shard."""
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def merge(paths, out):
    """The <testsuite> elements of every shard's report under one <testsuites>, its counts summed."""
    root = ET.Element("testsuites", name="AllTests")
    totals = dict(tests=0, failures=0, disabled=0, errors=0)
    for p in paths:
        shard = ET.parse(p).getroot()
        for k in totals:
            totals[k] += int(shard.get(k, 0))
        root.extend(shard.findall("testsuite"))
    for k, v in totals.items():
        root.set(k, str(v))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)


def show(i, n, log, code):
    log.seek(0)
    print(f"=== shard {i} of {n}: {code}", flush=True)
    sys.stdout.write(log.read())
    sys.stdout.flush()


def run(n, report, cmd, tmp):
    procs, logs = [], []

    def stop(sig, _frame):  # meson's timeout: kill the shards, show what they printed, exit
        for p in procs:
            if p.poll() is None:
                p.kill()
        for i, log in enumerate(logs, 1):
            show(i, n, log, f"killed ({signal.Signals(sig).name} to run_shards)")
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(n):
        env = dict(os.environ, GTEST_TOTAL_SHARDS=str(n), GTEST_SHARD_INDEX=str(i),
                   GTEST_OUTPUT=f"xml:{tmp}/shard{i}.xml")
        out = None
        if i:
            logs.append(open(os.path.join(tmp, f"shard{i}.log"), "w+"))
            out = logs[-1]
        try:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
        except OSError as e:  # the binary is missing or not executable: no shard can run
            print(f"run_shards: cannot run {cmd[0]}: {e}")
            for p in procs:
                p.kill()
            sys.exit(1)
    rc = 0
    for i, p in enumerate(procs):
        code = p.wait()
        if i:
            show(i, n, logs[i - 1], f"exit {code}")
        else:
            print(f"=== shard 0 of {n} (above): exit {code}", flush=True)
        if code and not rc:
            rc = code if code > 0 else 128 - code
    xmls = [os.path.join(tmp, f"shard{i}.xml") for i in range(n)]
    if report != "-":
        missing = [x for x in xmls if not os.path.exists(x)]
        if missing:  # a shard that died before writing: its cases are not counted, and it fails
            print(f"run_shards: no report from {', '.join(missing)}")
            rc = rc or 1
        merge([x for x in xmls if os.path.exists(x)], report)
    return rc


def main():
    if len(sys.argv) < 4 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit(__doc__)
    n, report, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if any(a.startswith("--gtest_output") for a in cmd[1:]):
        sys.exit("run_shards: --gtest_output would replace the shards' own reports")
    with tempfile.TemporaryDirectory(prefix="lowrank-shards-") as tmp:
        rc = run(n, report, cmd, tmp)
    sys.exit(rc)


if __name__ == "__main__":
    main()
