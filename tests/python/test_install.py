"""`meson install` puts the package in the configured Python's site-packages, with the folder the
library went to recorded in lowrank/_install.py, so that an installed package finds the
installed library. Staged with --destdir (a test must not write to the system): the recorded folder
is the final one, so the test checks that the library is staged there and that the package,
imported from the stage, names that path among those it tries."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

BUILD = os.environ.get("LOWRANK_TEST_BUILD_DIR", "")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BUILD, "build.ninja")),
                                reason="no build directory given (LOWRANK_TEST_BUILD_DIR): run "
                                       "through meson test")


def test_meson_install_stages_package_and_library():
    with tempfile.TemporaryDirectory() as stage:
        p = subprocess.run(["meson", "install", "-C", BUILD, "--destdir", stage, "--no-rebuild",
                            "--quiet"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        inits = [os.path.join(d, "__init__.py") for d, _, f in os.walk(stage)
                 if d.endswith(os.sep + "lowrank") and "__init__.py" in f]
        assert len(inits) == 1, inits
        pkg = os.path.dirname(inits[0])
        # every module of the source package is installed (python/meson.build lists them)
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "lowrank")
        wanted = {os.path.relpath(os.path.join(d, n), src) for d, _, f in os.walk(src)
                  for n in f if n.endswith(".py")}
        missing = sorted(m for m in wanted if not os.path.exists(os.path.join(pkg, m)))
        assert not missing, f"not installed (add them to python/meson.build): {missing}"
        assert os.path.exists(os.path.join(pkg, "torch", "hook.py"))
        ns = {}
        exec(open(os.path.join(pkg, "_install.py")).read(), ns)
        libdir = ns["LIBDIR"]
        assert os.path.isabs(libdir)
        assert os.path.exists(stage + os.path.join(libdir, "liblowrank.so"))
        # the perf binary finds the staged library through an $ORIGIN-relative RPATH (a moved
        # prefix keeps working), not an absolute one
        perf = [os.path.join(d, "lowrank_allreduce_perf") for d, _, f in os.walk(stage)
                if "lowrank_allreduce_perf" in f]
        assert len(perf) == 1, perf
        dyn = subprocess.run(["readelf", "-d", perf[0]], capture_output=True, text=True).stdout
        rpath = re.search(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", dyn).group(1)
        assert rpath.startswith("$ORIGIN/"), rpath
        ldd = subprocess.run(["ldd", perf[0]], capture_output=True, text=True, env={
            k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}).stdout
        found = re.search(r"liblowrank\.so\.0 => (\S+)", ldd)
        assert found and os.path.realpath(found.group(1)).startswith(stage), ldd
        env = {k: v for k, v in os.environ.items()
               if k not in ("LOWRANK_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
        code = ("import lowrank\ntry:\n    print('LOADED', lowrank.library_path())\n"
                "except lowrank.LibraryNotFoundError as e:\n    print('ERR', e)\n")
        r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=os.path.dirname(pkg)),
                           capture_output=True, text=True, timeout=60, cwd=stage)
        assert r.returncode == 0, r.stderr
        assert os.path.join(libdir, "liblowrank.so") in r.stdout, r.stdout
