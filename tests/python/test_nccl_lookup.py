"""Which NCCL lowrank takes (platform/nccl.h; lowrankGetNcclLibrary says which and from where):
LOWRANK_NCCL_LIBRARY, then an NCCL the process has loaded, then a PyPI NCCL wheel's
nvidia/nccl/lib/libnccl.so.2 under sys.path, then libnccl.so.2 from the dynamic loader. The NCCL
test double (a host-memory libnccl.so.2) is placed in each of those places in turn, with the later
places filled too, so that each case also shows it wins over what comes after it."""
import os
import shutil
import subprocess
import sys

import pytest

import pkgpath

DOUBLE_DIR = os.environ.get("LOWRANK_TEST_NCCL_DOUBLE_DIR", "")
DOUBLE = os.path.join(DOUBLE_DIR, "libnccl.so.2")

pytestmark = pytest.mark.skipif(not os.path.exists(DOUBLE),
                                reason="the NCCL test double was not built (no nccl.h): run "
                                       "through meson test")

QUERY = """
import ctypes, os, sys
import lowrank
from lowrank import _capi
lib = _capi.load()
{pre}
path, source, version = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
rc = lib.lowrankGetNcclLibrary(ctypes.byref(path), ctypes.byref(source), ctypes.byref(version))
if rc:
    print("ERR", lib.lowrankGetLastError(None).decode())
else:
    print("GOT", os.path.realpath(path.value.decode()), "|", source.value.decode())
"""


def _place(root, *parts):
    """A copy of the double at root/parts (a file named libnccl.so.2); its real path."""
    dst = os.path.join(root, *parts, "libnccl.so.2")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(DOUBLE, dst)
    return os.path.realpath(dst)


def _query(pre="", **env):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("LOWRANK_NCCL", "LD_LIBRARY_PATH", "LD_PRELOAD"))}
    e.update(env)
    pkgpath.use()  # the child imports the same package as this test (PYTHONPATH below)
    import lowrank
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__)))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), pkg_parent) if p)
    r = subprocess.run([sys.executable, "-c", QUERY.format(pre=pre)], env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith(("GOT", "ERR"))][0]
    if line.startswith("ERR"):
        return None, line
    path, source = line[4:].split(" | ")
    return path, source


@pytest.fixture
def places(tmp_path):
    """The double in a wheel's place under a sys.path folder, and in a folder for the loader."""
    return {"wheel": _place(tmp_path, "site", "nvidia", "nccl", "lib"),
            "site": str(tmp_path / "site"),
            "loader": _place(tmp_path, "ld"),
            "ld": str(tmp_path / "ld"),
            "env": _place(tmp_path, "env"),
            "preloaded": _place(tmp_path, "pre")}


def test_lowrank_nccl_library_comes_first(places):
    path, source = _query(LOWRANK_NCCL_LIBRARY=places["env"], PYTHONPATH=places["site"],
                          LD_LIBRARY_PATH=places["ld"])
    assert (path, source) == (places["env"], "LOWRANK_NCCL_LIBRARY")


def test_an_nccl_the_process_loaded_comes_next(places):
    # (after liblowrank: the double links it)
    pre = f"ctypes.CDLL({places['preloaded']!r}, mode=ctypes.RTLD_GLOBAL)"
    path, source = _query(pre=pre, PYTHONPATH=places["site"], LD_LIBRARY_PATH=places["ld"])
    assert (path, source) == (places["preloaded"], "loaded by the process")


def test_a_pypi_wheel_on_sys_path_comes_before_the_loader(places):
    path, source = _query(PYTHONPATH=places["site"], LD_LIBRARY_PATH=places["ld"])
    assert (path, source) == (places["wheel"], "PyPI wheel")


def test_the_dynamic_loader_comes_last(places):
    # LOWRANK_NCCL_WHEEL_PATH set empty: no wheel lookup (this Python may have a real NCCL wheel).
    path, source = _query(LD_LIBRARY_PATH=places["ld"], LOWRANK_NCCL_WHEEL_PATH="")
    assert (path, source) == (places["loader"], "dynamic loader")


def test_a_wheel_file_that_does_not_load_is_passed_over(tmp_path, places):
    bad = tmp_path / "bad" / "nvidia" / "nccl" / "lib"
    bad.mkdir(parents=True)
    (bad / "libnccl.so.2").write_text("not a library")
    path, source = _query(LOWRANK_NCCL_WHEEL_PATH=str(tmp_path / "bad"), LD_LIBRARY_PATH=places["ld"])
    assert (path, source) == (places["loader"], "dynamic loader")


def test_lowrank_loads_no_nccl_before_torch_and_then_takes_torchs():
    """Importing lowrank and loading its library loads no NCCL; where torch brings one, lowrank's
    lookup (after torch's import) takes that very file."""
    torch = pytest.importorskip("torch")
    code = """
import ctypes, os
import lowrank
lowrank.library_path()
maps = open('/proc/self/maps').read()
print('BEFORE', 'libnccl' in maps)
import torch
maps = open('/proc/self/maps').read()
nccl = sorted({l.split()[-1] for l in maps.splitlines() if 'libnccl.so' in l})
print('TORCH', nccl)
from lowrank import _capi
p, s, v = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
rc = _capi.load().lowrankGetNcclLibrary(ctypes.byref(p), ctypes.byref(s), ctypes.byref(v))
print('LOWRANK', rc, '|'.join((os.path.realpath(p.value.decode()), s.value.decode())) if rc == 0 else _capi.load().lowrankGetLastError(None).decode())
"""
    pkgpath.use()
    import lowrank
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("LOWRANK_NCCL", "LD_LIBRARY_PATH", "LD_PRELOAD"))}
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if ln.split(" ")[0] in ("BEFORE", "TORCH", "LOWRANK"))
    assert out["BEFORE"] == "False", r.stdout
    torch_nccl = eval(out["TORCH"])  # noqa: S307 (our own print of a list of paths)
    if not torch_nccl:
        pytest.skip(f"torch {torch.__version__} loads no NCCL at import (a CPU build)")
    rc, found = out["LOWRANK"].split(" ", 1)
    assert rc == "0", r.stdout
    assert found.split("|") == [os.path.realpath(torch_nccl[0]), "loaded by the process"], r.stdout
