#!/usr/bin/env python3
"""Runs a GoogleTest binary as N shards at once (GoogleTest's GTEST_TOTAL_SHARDS and
GTEST_SHARD_INDEX), for a suite whose cases each run on one core (the emulated device engine: the
emulation is one thread), so that a 2-core machine runs it in about half the time.

    run_shards.py N REPORT BINARY [ARGS...]

Each shard's output is printed after it ends, under a heading. REPORT: the JUnit XML of all shards'
cases together (what scripts/count_tests.py counts), or "-" for none. Exits with the first nonzero
status of a shard (a shard killed by a signal: 128 + the signal), else 0. A GTEST_FILTER in the
environment applies to every shard; each case runs in exactly one shard."""
import os
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
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)


def main():
    if len(sys.argv) < 4 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit(__doc__)
    n, report, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory(prefix="lowrank-shards-") as tmp:
        procs = []
        for i in range(n):
            env = dict(os.environ, GTEST_TOTAL_SHARDS=str(n), GTEST_SHARD_INDEX=str(i),
                       GTEST_OUTPUT=f"xml:{tmp}/shard{i}.xml")
            log = open(os.path.join(tmp, f"shard{i}.log"), "w+")
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        rc = 0
        for i, (p, log) in enumerate(procs):
            code = p.wait()
            log.seek(0)
            print(f"=== shard {i} of {n}: exit {code}", flush=True)
            sys.stdout.write(log.read())
            if code and not rc:
                rc = code if code > 0 else 128 - code
        xmls = [os.path.join(tmp, f"shard{i}.xml") for i in range(n)]
        if report != "-":
            missing = [x for x in xmls if not os.path.exists(x)]
            if missing:  # a shard that died before writing: its cases are not counted, and it fails
                print(f"run_shards: no report from {', '.join(missing)}")
                rc = rc or 1
            merge([x for x in xmls if os.path.exists(x)], report)
    sys.exit(rc)


if __name__ == "__main__":
    main()
