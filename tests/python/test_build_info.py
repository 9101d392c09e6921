"""lowrank.build_info(): the loaded library's resolved file, its sha256 and the revision it was
built from agree with the file itself and with git (asked here, not through the build's generator);
a loaded plugin is listed with its hash; a library replaced on disk after it was loaded is refused,
not hashed."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import lowrank
import pkgpath

HEX40, HEX64 = re.compile(r"[0-9a-f]{40}"), re.compile(r"[0-9a-f]{64}")


def _git(*args):
    """git's stdout in the checkout, or None where it is not a git checkout of its own."""
    try:
        top = subprocess.run(["git", "-C", pkgpath.ROOT, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True)
    except OSError:
        return None
    if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(pkgpath.ROOT):
        return None
    return subprocess.run(["git", "--no-optional-locks", "-C", pkgpath.ROOT, *args],
                          capture_output=True, text=True, check=True).stdout


def test_the_file_and_its_hash_are_the_loaded_library():
    info = lowrank.build_info()
    assert json.loads(json.dumps(info)) == info  # ready for a result's JSON as it is
    path = info["library"]
    assert os.path.isabs(path) and os.path.isfile(path) and not os.path.islink(path), path
    assert os.path.samefile(path, lowrank.library_path())
    with open(path, "rb") as f:
        assert info["sha256"] == hashlib.sha256(f.read()).hexdigest()
    code = lowrank.library_version()
    assert info["version"] == f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    assert info["package_version"] == lowrank.__version__
    for plugin in info["plugins"]:
        with open(plugin["library"], "rb") as f:
            assert plugin["sha256"] == hashlib.sha256(f.read()).hexdigest()


LOADS_THE_SHIM = """
import ctypes, json, os
import lowrank
lowrank.build_info()
ctypes.CDLL(os.environ["LOWRANK_TEST_SHIM"])
print(json.dumps(lowrank.build_info()))
"""


def test_a_loaded_plugin_is_listed_with_its_hash():
    shim = os.environ.get("LOWRANK_TEST_SHIM", "")
    if not shim:
        pytest.skip("no NCCL shim built (LOWRANK_TEST_SHIM unset)")
    env = dict(os.environ,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__))))
    r = subprocess.run([sys.executable, "-c", LOADS_THE_SHIM], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(shim, "rb") as f:
        want = {"library": os.path.realpath(shim), "sha256": hashlib.sha256(f.read()).hexdigest()}
    assert json.loads(r.stdout)["plugins"] == [want], r.stdout


def test_the_revision_is_the_checkouts():
    info = lowrank.build_info()
    assert HEX40.fullmatch(info["revision"]) or info["revision"] == "unknown", info
    assert info["sources_dirty"] in (True, False, None), info
    assert HEX64.fullmatch(info["sources_digest"]), info
    if pkgpath.INSTALLED:
        pytest.skip("an installed package: its library need not be built from this checkout")
    head = _git("rev-parse", "HEAD")
    if head is None:
        pytest.skip(f"{pkgpath.ROOT} is not a git checkout of its own")
    assert info["revision"] == head.strip()
    changes = _git("status", "--porcelain", "--untracked-files=all", "--", "plugin", "kernels",
                   "include", ":(glob)**/meson.build", ":(glob)**/meson_options.txt")
    assert info["sources_dirty"] == bool(changes.strip()), changes
    if not info["sources_dirty"]:  # the build's digest of the tree is the commit's
        digest = subprocess.run([sys.executable, os.path.join(pkgpath.ROOT, "scripts",
                                                              "source_revision.py"),
                                 "--digest", "HEAD"], capture_output=True, text=True, check=True)
        assert info["sources_digest"] == digest.stdout.strip()


REPLACED = """
import os, shutil, sys
import lowrank
lib = os.environ["LOWRANK_LIBRARY"]
lowrank.build_info()  # loads it
shutil.copy(lib, lib + ".new")
os.replace(lib + ".new", lib)  # a rebuild: a new file at the same path
try:
    lowrank.build_info()
except lowrank.LowrankError as e:
    print("refused:", e)
    sys.exit(0)
sys.exit("build_info hashed a file that is not the one loaded")
"""


def test_a_library_replaced_since_loading_is_refused(tmp_path):
    copy = tmp_path / "liblowrank.so"
    shutil.copy(lowrank.build_info()["library"], copy)
    env = dict(os.environ, LOWRANK_LIBRARY=str(copy),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__))))
    r = subprocess.run([sys.executable, "-c", REPLACED], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not the file this process loaded" in r.stdout, r.stdout


def test_python_m_lowrank_prints_them():
    info = lowrank.build_info()
    env = dict(os.environ,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(lowrank.__file__))))
    r = subprocess.run([sys.executable, "-m", "lowrank"], env=env, capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"  resolved: {info['library']}, sha256 {info['sha256']}\n" in r.stdout, r.stdout
    assert f"  built from revision {info['revision']} (" in r.stdout, r.stdout
    assert f"digest {info['sources_digest']})" in r.stdout, r.stdout
