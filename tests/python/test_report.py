"""`python -m lowrank`: exits 0 (1 when lowrank's library cannot be loaded) and names the library
loaded, the CUDA backend that goes with it (an in-tree build's own, not beside its liblowrank,
named for it through LOWRANK_CUDA_BACKEND), the shim, and what it set itself apart from what the
user set."""
import os
import re
import subprocess
import sys

import lowrank
import pkgpath


def _report(**env):
    e = {k: v for k, v in os.environ.items() if k not in ("LOWRANK_CUDA_BACKEND",
                                                          "LOWRANK_NCCL_WHEEL_PATH")}
    pkgpath.use()
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__)))
    e.update(env)
    return subprocess.run([sys.executable, "-m", "lowrank"], env=e, capture_output=True, text=True,
                          timeout=120, cwd="/")


def test_report_names_the_library_and_the_backend_that_goes_with_it():
    r = _report()
    assert r.returncode == 0, r.stdout + r.stderr
    lib = re.search(r"^  library: (\S+) \(version code (\d+)\)", r.stdout, re.M)
    assert lib and int(lib.group(2)) == lowrank.library_version(), r.stdout
    beside = os.path.join(os.path.dirname(os.path.realpath(lib.group(1))), "liblowrank_cuda.so")
    built = os.path.join(os.path.dirname(os.path.realpath(lib.group(1))), "plugin", "engine", "cuda",
                         "liblowrank_cuda.so")
    backend = re.search(r"^CUDA backend: (\S+)$", r.stdout, re.M)
    if os.path.exists(beside):
        assert backend and backend.group(1) == beside, r.stdout
    elif os.path.exists(built):  # an in-tree build: named for the library, and said so
        assert backend and backend.group(1) == built, r.stdout
        assert "(LOWRANK_CUDA_BACKEND: set by the package to its build's backend)" in r.stdout
    else:
        assert re.search(r"^CUDA backend: absent", r.stdout, re.M), r.stdout
    assert re.search(r"^NCCL shim \(LD_PRELOAD\): ", r.stdout, re.M), r.stdout
    assert "(LOWRANK_NCCL_WHEEL_PATH: set by the package to sys.path)" in r.stdout


def test_a_variable_the_user_set_is_reported_as_set():
    r = _report(LOWRANK_CUDA_BACKEND="/nonexistent/liblowrank_cuda.so", LOWRANK_NCCL_WHEEL_PATH="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOWRANK_CUDA_BACKEND=/nonexistent/liblowrank_cuda.so" in r.stdout, r.stdout
    assert "set by the package" not in r.stdout, r.stdout
    assert re.search(r"^CUDA backend: absent", r.stdout, re.M), r.stdout


def test_a_library_that_cannot_be_loaded_exits_1_with_the_report():
    r = _report(LOWRANK_LIBRARY="/nonexistent/liblowrank.so")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"^lowrank: failed: ", r.stdout, re.M), r.stdout
    assert "/nonexistent/liblowrank.so" in r.stdout, r.stdout
    assert re.search(r"^torch", r.stdout, re.M), "the rest of the report is printed: " + r.stdout
    assert "the library could not be loaded" in r.stderr, r.stderr
