"""The wheel as a user gets it (tests/wheel/run.sh builds it and installs it into the torch 2.x
venv, then runs this with Debian's python3): what it carries and what it leaves to the system,
`python -m lowrank` with and without torch, the console script, the example, and a missing UCX.
Inputs: LOWRANK_TEST_WHEEL (the .whl), LOWRANK_TEST_VENV (a venv with the wheel and torch)."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHEEL = os.environ.get("LOWRANK_TEST_WHEEL", "")
VENV = os.environ.get("LOWRANK_TEST_VENV", "")
VPY = os.path.join(VENV, "bin", "python")

pytestmark = pytest.mark.skipif(not (os.path.exists(WHEEL) and os.path.exists(VPY)),
                                reason="no wheel or venv given: run through tests/wheel/run.sh")


def _env(**more):
    """The environment of a user's shell: none of lowrank's or the tests' variables."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("LOWRANK_", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD"))}
    e.update(more)
    return e


def _run(cmd, cwd, timeout=300, **env):
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def _names():
    with zipfile.ZipFile(WHEEL) as z:
        return z.namelist()


def _elf(path, what):
    """readelf -d's NEEDED or RUNPATH/RPATH values of an ELF file."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    tag = {"needed": r"\(NEEDED\)", "rpath": r"\((?:RUNPATH|RPATH)\)"}[what]
    return re.findall(tag + r".*\[(.*)\]", out)


def _installed(*parts):
    r = subprocess.run([VPY, "-c", "import lowrank, os; print(os.path.dirname(lowrank.__file__))"],
                       env=_env(), cwd="/", capture_output=True, text=True, check=True)
    return os.path.join(r.stdout.strip(), *parts)


def test_name_says_py3_none_and_a_platform():
    name = os.path.basename(WHEEL)
    m = re.fullmatch(r"lowrank-([\d.]+)-py3-none-((?:manylinux_\d+_\d+|linux)_x86_64(?:\.\S+)?)\.whl", name)
    assert m, name
    text = open(os.path.join(ROOT, "meson.build")).read()
    assert m.group(1) == re.search(r"version: '([^']+)'", text).group(1)


def test_carries_lowranks_libraries_and_no_ucx_cuda_or_nccl():
    names = _names()
    libs = {os.path.basename(n) for n in names if n.startswith("lowrank/lib/")}
    assert "liblowrank.so" in libs and "lowrank/bin/lowrank_allreduce_perf" in names, names
    # CI builds where nvcc and nccl.h are: the CUDA backend, the shim and the drop-in are in
    assert {"liblowrank_cuda.so", "liblowrank_nccl.so", "libnccl.so.2"} <= libs, libs
    foreign = [n for n in names if re.search(r"lib(ucp|uct|ucs|ucm|cuda|cudart|nccl)[^/]*\.so", n)
               and not n.endswith("lowrank/lib/nccl/libnccl.so.2")]
    assert not foreign, foreign
    with zipfile.ZipFile(WHEEL) as z:
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        wheel = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert "lowrank-allreduce-perf = lowrank._perf:main" in entry
    assert "Tag: py3-none-" in wheel


def _origin_rpath(path, want):
    """The RPATH of path has `want` and only $ORIGIN-relative entries (a wheel can move; with
    Meson < 1.6 the build's own $ORIGIN entries stay beside the install one: harmless)."""
    entries = ":".join(_elf(path, "rpath")).split(":")
    assert want in entries and all(e.startswith("$ORIGIN") for e in entries), (path, entries)


def test_installed_libraries_find_each_other_and_need_only_the_driver():
    lib = _installed("lib")
    _origin_rpath(os.path.join(lib, "liblowrank_cuda.so"), "$ORIGIN")
    needed = _elf(os.path.join(lib, "liblowrank_cuda.so"), "needed")
    assert not [n for n in needed if "cudart" in n or "cublas" in n or "nccl" in n], needed
    _origin_rpath(os.path.join(lib, "liblowrank_nccl.so"), "$ORIGIN")
    _origin_rpath(os.path.join(lib, "nccl", "libnccl.so.2"), "$ORIGIN/..")
    _origin_rpath(_installed("bin", "lowrank_allreduce_perf"), "$ORIGIN/../lib")
    # each finds liblowrank.so of its own package (ldd resolves through those RPATHs)
    for f in (os.path.join(lib, "liblowrank_nccl.so"), _installed("bin", "lowrank_allreduce_perf")):
        ldd = subprocess.run(["ldd", f], capture_output=True, text=True, env=_env()).stdout
        found = re.search(r"liblowrank\.so => (\S+)", ldd)
        assert found and os.path.realpath(found.group(1)) == os.path.join(lib, "liblowrank.so"), ldd
    assert any(n.startswith("libucp.so") for n in _elf(os.path.join(lib, "liblowrank.so"), "needed"))


def test_python_m_lowrank_reports_from_site_packages(tmp_path):
    r = _run([VPY, "-m", "lowrank"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"library: \S*site-packages/lowrank/lib/liblowrank\.so", out), out
    assert re.search(r"^UCX \d+\.\d+", out, re.M) and "transports loaded: " in out, out
    # the targets the build was configured for (tests/wheel/run.sh reads -Dgpu_targets; CI builds one)
    archs = os.environ.get("LOWRANK_TEST_CUDA_ARCHS", "sm_80,sm_90,compute_90")
    assert re.search(r"built for CUDA \d+\.\d+, GPU architectures " + re.escape(archs) + ",", out), out
    assert re.search(r"^torch 2\.", out, re.M), out
    assert re.search(r"^NCCL \d+\.\d+\.\d+: \S+libnccl\.so\.2 \(found: ", out, re.M), out
    assert "LOWRANK_* set: none" in out
    shim = _run([VPY, "-m", "lowrank", "--shim-path"], cwd=tmp_path)
    assert shim.returncode == 0 and shim.stdout.strip() == _installed("lib", "liblowrank_nccl.so")


def test_console_script_runs_the_perf_binary(tmp_path):
    r = _run([os.path.join(VENV, "bin", "lowrank-allreduce-perf"), "-t", "2", "-b", "4K", "-e", "8K",
              "-n", "2", "-w", "1", "--triad-mib", "0"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "8192" in r.stdout, r.stdout


def test_example_trains_two_epochs_on_two_processes(tmp_path):
    r = _run([VPY, os.path.join(ROOT, "examples", "ddp_cpu.py"), "--spawn", "2", "--epochs", "2"],
             cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"lowrank \S+ from \S*site-packages/lowrank", r.stdout), r.stdout
    accs = [float(a) for a in re.findall(r"test accuracy ([\d.]+)", r.stdout)]
    assert len(accs) == 2 and accs[-1] > 0.8, r.stdout
    assert re.search(r"epoch 2: .* [1-9]\d* compressed calls", r.stdout), r.stdout


def _hide(paths, command, cwd, **env):
    """Runs the shell `command` in a mount namespace where each of `paths` is an empty file (bind
    mounts: LD_LIBRARY_PATH cannot hide what the loader's cache lists)."""
    empty = os.path.join(cwd, "empty")
    open(empty, "w").close()
    mounts = "".join(f"mount --bind {empty} {p} && " for p in paths)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", mounts + command],
                          env=_env(**env), cwd=cwd, capture_output=True, text=True, timeout=180)


def _need_namespaces():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a mount namespace)")


def _cached(pattern):
    """Paths of the libraries matching `pattern` in the dynamic loader's cache (ldconfig -p)."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    return sorted({m.group(1) for m in re.finditer(r"^\s*" + pattern + r".* => (\S+)$", out, re.M)})


def test_python_m_lowrank_without_torch_nccl_or_gpu(tmp_path):
    """Debian's python3 in a venv of its own (no system site-packages: no torch, no numpy), with
    the system's NCCL hidden (a mount namespace): torch, NCCL and the CUDA driver each reported
    absent with the reason, exit 0."""
    _need_namespaces()
    venv = tmp_path / "bare"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # pip of the torch venv installs into the bare one (--target: no pip needed there)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([VPY, "-m", "pip", "install", "-q", "--no-deps", "--target", site, WHEEL],
                   check=True, env=_env())
    r = _hide(_cached(r"libnccl\.so") + _cached(r"libcuda\.so"), f"{py} -m lowrank", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "torch: absent (No module named 'torch')" in out, out
    assert re.search(r"^NCCL: absent \(.*cannot load the NCCL library libnccl\.so\.2", out, re.M), out
    assert re.search(r"CUDA driver: absent \(libcuda\.so\.1", out), out
    assert re.search(r"library: " + re.escape(site) + r"/lowrank/lib/liblowrank\.so", out), out


def test_missing_ucx_is_the_documented_error_not_a_crash(tmp_path):
    """UCX's libraries hidden (a mount namespace): importing lowrank works, making a communicator
    raises LibraryNotFoundError naming Debian's libucx0, and `python -m lowrank` prints its whole
    report with the reason and exits 1 (the library did not load)."""
    _need_namespaces()
    libs = _cached(r"lib(?:ucp|uct|ucs|ucm)\.so")
    assert libs
    code = ("import lowrank\n"
            "try:\n    lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0)\n"
            "except lowrank.LibraryNotFoundError as e:\n    print('ERR', e)\n")
    r = _hide(libs, f"{VPY} -c \"$CODE\" && {{ {VPY} -m lowrank; echo \"report exit $?\"; }}",
              str(tmp_path), CODE=code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^report exit 1$", r.stdout, re.M), r.stdout + r.stderr
    assert "the library could not be loaded" in r.stderr, r.stderr
    assert re.search(r"^ERR .*liblowrank needs UCX.*apt-get install libucx0", r.stdout, re.M), r.stdout
    assert re.search(r"^lowrank: failed: LibraryNotFoundError: .*liblowrank needs UCX", r.stdout, re.M), r.stdout
