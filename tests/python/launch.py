"""Starts the ranks of the multi-process tests without paying torch's import in each one.

A worker is forked from one server process that has imported torch and numpy and nothing of
lowrank (multiprocessing's "forkserver", started once per pytest run from the same Python): a
new process, as torchrun would start, that begins in a fraction of a second instead of the 2 s
(Debian's torch 1.13) or 4 s (PyPI's 2.x) an import takes here, most of the Python tests' time on
2 cores. It then takes torchrun's variables as its whole environment, its output goes to a file,
and the script runs as __main__. What a fork cannot give, an exec launch keeps (conftest's
run_ranks(launch="exec")): variables read when torch is imported (OMP_NUM_THREADS, LD_PRELOAD).
"""
import multiprocessing
import os
import runpy
import sys

_PRELOAD = ["torch", "torch.distributed", "torch.nn", "numpy"]
_context = None


def context():
    """The forkserver context, its server preloading torch (made at the first call)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def run_script(script, args, env, out):
    """In the forked worker: output to `out` (both streams, line-buffered, the C library's
    logging too), `env` as the environment, `script` run as __main__ with `args`. Exit status:
    the script's sys.exit code, 1 on an exception (its traceback in `out`), -N if killed by
    signal N (multiprocessing's exitcode, as Popen's returncode)."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
