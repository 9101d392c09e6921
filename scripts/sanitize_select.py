#!/usr/bin/env python3
"""Picks the tests of a configured build that scripts/sanitize.sh runs, and the ninja targets they
need (so that only those are built).

    sanitize_select.py BUILD SELECTOR... [--exclude NAME...]

A SELECTOR is a suite (":gpu") or a test name ("engine"). Tests that need nvcc-compiled code (a
.cu among the inputs of their targets: the real GPU's) are left out: they skip without a device
and nvcc is not wanted here. Prints "tests NAME..." then "targets PATH..." (relative to BUILD)."""
import json
import os
import subprocess
import sys

build = sys.argv[1]
args = sys.argv[2:]
exclude = set(args[args.index("--exclude") + 1:]) if "--exclude" in args else set()
selectors = args[:args.index("--exclude")] if "--exclude" in args else args

info = os.path.join(build, "meson-info")
targets = {t["id"]: t for t in json.load(open(os.path.join(info, "intro-targets.json")))}
tests, needed = [], []


def rel(path):
    return os.path.relpath(path, build)


def needs_nvcc(outputs):
    out = subprocess.run(["ninja", "-C", build, "-t", "inputs"] + outputs,
                         capture_output=True, text=True, check=True).stdout
    return any(line.endswith(".cu") for line in out.splitlines())


for t in json.load(open(os.path.join(info, "intro-tests.json"))):
    suites = {s.split(":")[-1] for s in t["suite"]}
    if t["name"] in exclude or not any(
            s == t["name"] or (s.startswith(":") and s[1:] in suites) for s in selectors):
        continue
    outs = [rel(targets[d]["filename"][0]) for d in t["depends"] if d in targets]
    cmd = t["cmd"][0]
    if os.path.abspath(cmd).startswith(os.path.abspath(build) + os.sep) and rel(cmd) not in outs:
        outs.append(rel(cmd))
    if needs_nvcc(outs):
        continue
    tests.append(t["name"])
    needed += [o for o in outs if o not in needed]

print("tests", *tests)
print("targets", *needed)
