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
    built = os.path.join(os.path.dirname(os.path.realpath(lib.group(1))), "plugin", "cuda_backend",
                         "liblowrank_cuda.so")
    backend = re.search(r"^CUDA backend: (\S+)$", r.stdout, re.M)
    if os.path.exists(beside):
        assert backend and backend.group(1) == beside, r.stdout
    elif os.path.exists(built):  # an in-tree build: named for the library, and said so
        assert backend and backend.group(1) == built, r.stdout
        assert "(LOWRANK_CUDA_BACKEND: set by the package to its build's backend)" in r.stdout
    else:
        assert re.search(r"^CUDA backend: (absent|not built yet)", r.stdout, re.M), r.stdout
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


def test_help_is_whole():
    """--help prints the module's whole description (it was cut at its first line once)."""
    import lowrank.__main__ as main
    pkgpath.use()
    e = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__))))
    r = subprocess.run([sys.executable, "-m", "lowrank", "--help"], env=e, capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    for line in main.__doc__.splitlines():
        assert line.rstrip() in r.stdout, (line, r.stdout)
    assert "--shim-path" in r.stdout


def _source_copy(tmp_path):
    """A checkout with no build (its meson.build, python/lowrank copied) and an installed lowrank
    elsewhere (a stand-in package): what a user has who ran `pip install .` and stays in the
    clone."""
    import shutil
    checkout = tmp_path / "clone"
    shutil.copytree(os.path.dirname(os.path.abspath(lowrank.__file__)), checkout / "python" / "lowrank",
                    ignore=shutil.ignore_patterns("__pycache__", "lib", "bin", "_install.py"))
    (checkout / "meson.build").write_text("project('lowrank', 'cpp', version: '0.1.0')\n")
    site = tmp_path / "site"
    (site / "lowrank").mkdir(parents=True)
    (site / "lowrank" / "__init__.py").write_text("")
    # nothing that finds a built library for it (meson test sets LOWRANK_LIBRARY and LD_LIBRARY_PATH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWRANK_") and k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = str(site)
    return checkout, site, env


def test_the_source_copy_says_so(tmp_path):
    """Run from a checkout's python/ folder with no build there, the report and --shim-path say
    that the source copy was imported, which installed copy it hides and how to use a built one;
    the shim's absence is not put on the build's options."""
    checkout, site, env = _source_copy(tmp_path)
    r = subprocess.run([sys.executable, "-m", "lowrank"], env=env, capture_output=True, text=True,
                       timeout=120, cwd=checkout / "python")
    assert r.returncode == 1, r.stdout + r.stderr
    failed = next(line for line in r.stdout.splitlines() if line.startswith("lowrank: failed: "))
    assert f"the source copy in the checkout {checkout}" in failed, failed
    assert f"hides the installed lowrank in {site / 'lowrank'}" in failed, failed
    assert "run from outside the checkout's python/ folder" in failed and "LOWRANK_LIBRARY" in failed
    shim = next(line for line in r.stdout.splitlines() if line.startswith("NCCL shim"))
    assert "nccl.h" not in shim and "nccl_shim=disabled" not in shim, shim
    r = subprocess.run([sys.executable, "-m", "lowrank", "--shim-path"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=checkout / "python")
    assert r.returncode == 1 and "the source copy" in r.stderr and "nccl.h" not in r.stderr, r.stderr


def test_a_built_checkout_is_not_called_a_source_copy(tmp_path):
    """A checkout with a build (build/liblowrank.so, here a file that is not a library): the
    message is the usual one, naming what was tried."""
    checkout, site, env = _source_copy(tmp_path)
    (checkout / "build").mkdir()
    (checkout / "build" / "liblowrank.so").write_text("not a library")
    r = subprocess.run([sys.executable, "-m", "lowrank"], env=env, capture_output=True, text=True,
                       timeout=120, cwd=checkout / "python")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "source copy" not in r.stdout and str(checkout / "build" / "liblowrank.so") in r.stdout


def test_a_configured_but_unbuilt_shim_is_not_called_absent(tmp_path, monkeypatch):
    """After scripts/demo.sh (the library and the perf binary built, the shim configured only), the
    shim's line says it is not built yet and how to build it, not that the build left it out; with
    the shim built, its path."""
    from lowrank import _paths, _report as report
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text(f"rule x\nbuild {report.SHIM_TARGET}: cpp_LINKER a.o\n")
    monkeypatch.setattr(_paths, "_CHECKOUT", str(tmp_path))
    monkeypatch.setattr(_paths, "package_file", lambda *parts: None)
    monkeypatch.delenv("LOWRANK_LIBRARY", raising=False)  # this fake checkout's library, if any
    out = []
    report._shim(out)
    assert out[0].startswith("NCCL shim (LD_PRELOAD): not built yet"), out
    assert f"ninja -C {build} {report.SHIM_TARGET}" in out[0] and "nccl.h" not in out[0], out
    shim = build / report.SHIM_TARGET
    shim.parent.mkdir(parents=True)
    shim.write_text("")
    out = []
    report._shim(out)
    assert out == [f"NCCL shim (LD_PRELOAD): {shim}"], out
    (build / "build.ninja").write_text("rule x\n")  # not configured: absent, as before
    shim.unlink()
    out = []
    report._shim(out)
    assert out[0].startswith("NCCL shim (LD_PRELOAD): absent (") and "not built yet" not in out[0], out


def test_shim_and_perf_binary_of_the_build_whose_library_is_loaded(tmp_path, monkeypatch):
    """A checkout with two builds: the shim and the perf binary are those of the build whose
    liblowrank the package loads (the newest library), not the newest shim (another build's, made
    later: a sanitizer build beside the release one); LOWRANK_LIBRARY picks the build."""
    from lowrank import _paths
    monkeypatch.setattr(_paths, "_CHECKOUT", str(tmp_path))
    monkeypatch.setattr(_paths, "package_file", lambda *parts: None)
    monkeypatch.delenv("LOWRANK_LIBRARY", raising=False)
    shim_rel = os.path.join("plugin", "nccl_shim", "liblowrank_nccl.so")
    perf_rel = os.path.join("perf", "lowrank_allreduce_perf")
    files = {}
    for build, lib_t, other_t in (("build", 300, 100), ("build-asan", 200, 400)):
        for rel, t in (("liblowrank.so", lib_t), (shim_rel, other_t), (perf_rel, other_t)):
            path = tmp_path / build / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
            os.utime(path, (t, t))
            files[build, rel] = str(path)
    if not _paths.library_candidates()[0].startswith(str(tmp_path)):
        import pytest
        pytest.skip("a `meson install`ed liblowrank comes before the checkout's builds here")
    assert _paths.library_to_load() == files["build", "liblowrank.so"]
    assert _paths.shim_path() == files["build", shim_rel]
    assert _paths.perf_binary() == files["build", perf_rel]
    monkeypatch.setenv("LOWRANK_LIBRARY", str(tmp_path / "build-asan"))
    assert _paths.shim_path() == files["build-asan", shim_rel]
    assert _paths.perf_binary() == files["build-asan", perf_rel]
