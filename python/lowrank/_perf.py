"""The console script lowrank-allreduce-perf: runs the package's lowrank_allreduce_perf (the
nccl-tests style benchmark, docs/perf.md) with the arguments given."""
import os
import sys

from . import _paths


def main():
    binary = _paths.perf_binary()
    if binary is None:
        print("lowrank-allreduce-perf: lowrank_allreduce_perf is not in this install "
              "(lowrank/bin) nor in a build of the checkout", file=sys.stderr)
        sys.exit(2)
    os.execv(binary, [binary] + sys.argv[1:])
